-- The tick a pass began to fire, committed on its own before the firing transaction and
-- cleared by it: a pass that finds it still set knows that a firing began and did not
-- finish (its worker was killed, or lost the database), and catch_up='last' fires that
-- tick too, not only the latest.
ALTER TABLE schedules ADD COLUMN attempted_tick timestamptz;
-- Since when the workers that register the service's schedules no longer declare this one
-- (removed from the code); cleared when one declares it again. Declared again after a
-- long absence, it starts again from its first tick after now, as after a pause.
ALTER TABLE schedules ADD COLUMN absent_since timestamptz;
