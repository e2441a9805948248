-- Named queries of the operator console, parsed once by sql/console.py. `{schema}` is a
-- service's schema, bound as an identifier.

-- dead_letters_by_cause --
-- Dead letters grouped by consumer and cause: the reason with UUIDs and numbers masked, so
-- one failure hitting many messages is one line, with its count, its latest occurrence
-- and that occurrence's reason as it was written.
SELECT consumer,
       left(regexp_replace(
                regexp_replace(reason, '[0-9a-f]{{8}}-[0-9a-f]{{4}}-[0-9a-f]{{4}}-[0-9a-f]{{4}}-[0-9a-f]{{12}}',
                               '<id>', 'gi'),
                '[0-9]+', '<n>', 'g'), 200) AS cause,
       count(*) AS count,
       max(created_at) AS latest_at,
       max(id) AS latest_id,
       (array_agg(reason ORDER BY id DESC))[1] AS latest_reason
FROM {schema}.dead_letters
GROUP BY 1, 2
ORDER BY count(*) DESC, max(created_at) DESC
LIMIT %(limit)s
