-- KEYS[1] record; ARGV: channel. For operators: delete the record whatever its state, and wake
-- the duplicates waiting on it (wait mode), which claim again and find the key free.
local deleted = redis.call('DEL', KEYS[1])
if deleted > 0 then redis.call('PUBLISH', ARGV[1], 'forgotten') end
return deleted
