-- KEYS[1] the event's key, KEYS[2] its failures hash; ARGV[1] the holder's token, ARGV[2] the
-- maximum attempts, ARGV[3] the retention in milliseconds, ARGV[4] the error's text, ARGV[5] the
-- event's payload (empty when none was given), kept with a parked event.
-- Counts a failed attempt of the token's claim: at the maximum the event is parked (kept with its
-- failures until it is replayed, as the SQL consumers keep parked rows; deliveries report it
-- parked), else the claim is released for a redelivery.
-- {'lost', 0} if the token no longer holds the claim.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'lost', 0} end
local attempts = redis.call('HINCRBY', KEYS[2], 'attempts', 1)
redis.call('HSET', KEYS[2], 'last_error', ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
if attempts >= tonumber(ARGV[2]) then
  redis.call('SET', KEYS[1], 'parked')
  redis.call('PERSIST', KEYS[2])
  if ARGV[5] ~= '' then redis.call('HSET', KEYS[2], 'payload', ARGV[5]) end
  local time = redis.call('TIME')
  redis.call('HSET', KEYS[2], 'parked_at', time[1] * 1000 + math.floor(time[2] / 1000))
  return {'parked', attempts}
end
redis.call('DEL', KEYS[1])
return {'failed', attempts}
