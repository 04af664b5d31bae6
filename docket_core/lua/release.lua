-- ReleaseSlot: ARGV = prefix, group, memo header, request number, limit,
-- holder, now, pass_on ('1' or '0').  Runs in the limit's namespace
-- (ARGV[1]: P for a limit without a scope, S for a scoped one) and touches
-- nothing else.  Removes the holder's slot; if it held one, queues the
-- oldest live waiter this namespace's own docket parked in P:wait:<limit>
-- (a limit without a scope), and when none woke, pops the docket that
-- waited longest among the limit's waiting dockets (S:stale:<limit>: the
-- scoped chain goes on with WakeParked there).  With pass_on (the docket
-- last popped had nobody left to wake) it only pops the next waiting
-- docket, the slots untouched.  A holder whose slot was taken over (it
-- went stale) frees nothing.  Returns {how many woke (0 or 1), the docket
-- popped or ''}; a resend answers its first outcome and does nothing.
local seq, limit, holder, now, pass_on = ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8] == '1'
open_memo(ARGV[3])
local first = recall(seq)
if first then return first end
local woken = 0
if not pass_on then
  if redis.call('ZREM', P .. ':slots:' .. limit, holder) == 0 then return remember(seq, {0, ''}) end
  woken = wake(limit, now)
end
if woken == 1 then return remember(seq, {1, ''}) end
return remember(seq, {0, pop_oldest(P .. ':stale:' .. limit) or ''})
