-- KEYS[1] the event's key; ARGV[1] the holder's token, ARGV[2] the retention in milliseconds.
-- 1 if the token still held the claim and the event is now done, 0 if the claim was lost.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], 'done', 'PX', ARGV[2])
return 1
