-- KEYS[1] the event's key; ARGV[1] the holder's token, ARGV[2] the new lease in milliseconds.
-- 1 if the token still holds the claim and its lease was extended, 0 if the claim was lost.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
