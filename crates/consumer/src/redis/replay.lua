-- KEYS[1] the event's key, KEYS[2] its failures hash.
-- Forgets a parked event (1), so that its next delivery runs the work with fresh attempts; 0 if
-- it was not parked.
if redis.call('GET', KEYS[1]) ~= 'parked' then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
