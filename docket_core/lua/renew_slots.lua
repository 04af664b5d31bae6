-- RenewLeases, the part in one scope's namespace S (ARGV[1]): ARGV = prefix,
-- group, now, slot_ttl_ms, then (limit, holder) pairs.  Renews each holder
-- still in S:slots:<limit> to now (its waiting dockets, S:stale:<limit>,
-- live as long); returns {{}, holders whose slots are gone (taken over as
-- stale)}, the shape of renew.lua's reply.
if (#ARGV - 4) % 2 ~= 0 then error('docket: renew_slots takes (limit, holder) pairs') end
return {{}, renew_slots(5, ARGV[3], ARGV[4])}
