-- ConfirmSlot, step 2a of a scoped limit (its slot was taken), in the
-- docket's namespace P: ARGV = prefix, group, '' (no memo), then the fields
-- of one or more confirmations packed into one argument (unpack_fields), 6
-- each: worker, id, key, generation, limit, namespace (the scope's
-- "{scope}").
-- For each: 2 (lost, nothing written) when the worker no longer holds the
-- delivery; else 1, and a record still at the generation is marked as
-- holding the slot (its 'slot' and 'pin').  Idempotent: no memo.
local f = unpack_fields(ARGV[4])
if #f % 6 ~= 0 then error('docket: confirm takes 6 fields a confirmation') end
local confirmed = {}
for i = 1, #f, 6 do
  local worker, id, key, gen, limit, S = f[i], f[i + 1], f[i + 2], f[i + 3], f[i + 4], f[i + 5]
  if holder_of(id) ~= worker then
    confirmed[#confirmed + 1] = 2
  else
    local run = run_key(key)
    if tonumber(redis.call('HGET', run, 'g') or '-1') == tonumber(gen) then
      redis.call('HSET', run, 'slot', limit, 'pin', S)
    end
    confirmed[#confirmed + 1] = 1
  end
end
return confirmed
