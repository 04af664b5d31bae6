-- Finish: ARGV = prefix, group, memo header, then the fields of one or more
-- deliveries packed into one argument (unpack_batch), 10 a delivery: id,
-- key, generation, state, now, ttl, error, has_result, result, request
-- number.  A flush's consecutive finishes go in one call.  For each:
-- acknowledges the delivery; records the outcome only if the generation is
-- still current.  Nothing changes while another worker holds the delivery.
-- Returns one 1 (recorded) or 0 per delivery; a resend answers its first
-- outcome and does nothing.  The batch reads its outcomes, which deliveries
-- the sender holds, and acknowledges, each in one command (a delivery
-- finished twice in one call is acknowledged once: the second sees it held,
-- as the first left it, and answers as it would have)
local items = unpack_batch(ARGV[4], 10)
open_memo(ARGV[3])
local ids, seqs = {}, {}
for i, item in ipairs(items) do
  ids[i], seqs[i] = item[1], item[10]
end
local firsts = recall_all(seqs)
local held = WORKER and held_by(WORKER, ids) or {}
local done = {}
local function finish(id, key, gen, state, now, ttl, err, has_result, result)
  -- a worker whose lease lapsed and was taken over leaves the run to the taker
  if WORKER and not held[id] then
    local holder = holder_of(id)
    if holder and holder ~= WORKER then return 0 end
  end
  if id ~= '' then done[#done + 1] = id end
  return record_end(key, gen, state, now, ttl, err, has_result, result)
end
local recorded = {}
for i, f in ipairs(items) do
  local seq = f[10]
  local first = firsts[seq]
  if first == nil then
    first = remember_later(seq, finish(f[1], f[2], tonumber(f[3]), f[4], f[5], f[6], f[7],
                                       f[8], f[9]))
    if MEMO and seq ~= '' then firsts[seq] = first end
  end
  recorded[i] = first
end
acknowledge_all(done)
remember_all()
return recorded
