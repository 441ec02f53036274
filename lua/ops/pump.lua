-- pump.lua: the entry of "pump": goes on with work an earlier script left
-- (grants, purges).
--
-- KEYS: one resource's five keys.
-- ARGV: op ("pump").
-- Reply: {more, nextEventMs}, more 1 when work is left still.

begin(KEYS)
run_queues(declared())
finish()
return { more_flag(), next_event() }
