-- KEYS[1] the event's key; ARGV[1] the holder's token.
-- Deletes the claim so that a redelivery may run the work, if the token still holds it.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
