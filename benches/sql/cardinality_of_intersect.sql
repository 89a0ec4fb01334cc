-- cardinality(list_intersect(a, b)), planned as list_intersect_count(a, b), alternated with
-- the same count through the lists (array_length). Run: dfsets -f benches/sql/cardinality_of_intersect.sql
CREATE TABLE t AS SELECT range(v % 97, v % 97 + 10 + (v * 7919) % 990, 1 + v % 3) AS a, range(v % 89, v % 89 + 10 + (v * 104729) % 990, 2 + v % 2) AS b FROM generate_series(1, 200000) AS s(v);
SELECT count(*), sum(cardinality(a)) + sum(cardinality(b)) AS values FROM t;
SELECT 'count (rewritten)' AS q, sum(cardinality(list_intersect(a, b))) AS n FROM t;
SELECT 'lists' AS q, sum(array_length(list_intersect(a, b))) AS n FROM t;
SELECT 'count (rewritten)' AS q, sum(cardinality(list_intersect(a, b))) AS n FROM t;
SELECT 'lists' AS q, sum(array_length(list_intersect(a, b))) AS n FROM t;
SELECT 'count (rewritten)' AS q, sum(cardinality(list_intersect(a, b))) AS n FROM t;
SELECT 'lists' AS q, sum(array_length(list_intersect(a, b))) AS n FROM t;
SELECT 'count (rewritten)' AS q, sum(cardinality(list_intersect(a, b))) AS n FROM t;
SELECT 'lists' AS q, sum(array_length(list_intersect(a, b))) AS n FROM t;
