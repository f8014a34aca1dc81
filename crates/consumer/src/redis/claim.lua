-- KEYS[1] the event's key, KEYS[2] its failures hash; ARGV[1] a fresh token, ARGV[2] the lease in
-- milliseconds.
-- Absent (never claimed, released, or its lease lapsed): claimed by this token until the lease
-- ends. Otherwise 'done', 'parked' with its failed attempts, or in progress with the
-- milliseconds left on the holder's lease.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {'claimed', 0}
end
local value = redis.call('GET', KEYS[1])
if value == 'done' then
  return {'done', 0}
end
if value == 'parked' then
  return {'parked', tonumber(redis.call('HGET', KEYS[2], 'attempts') or '0')}
end
return {'inprogress', redis.call('PTTL', KEYS[1])}
