-- Dead letters you can replay and that do not pile up for ever (issue 33):
--   * `replayed_at`: when `sluice replay` sent the dead letter's payload back to Kafka (NULL: not
--     replayed). Replay skips marked ones unless told `--again`; the record itself is stored
--     once whatever happens (the persister's unique key is its envelope id).
--   * an index on `received_at`: the persister's hourly maintenance deletes dead letters older
--     than `persist.dead_letter_retention_days`, and replay chooses them by time.
-- A nullable column without a default and an index on a table that is small by design: a
-- catalog change and one pass over the table.
ALTER TABLE dead_letters ADD COLUMN replayed_at timestamptz;
CREATE INDEX dead_letters_received_at ON dead_letters (received_at);
