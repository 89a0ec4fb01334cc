-- datafusion-sets quickstart: run with
--   cargo run --release -- -f examples/quickstart.sql
-- It builds an inverted index (term -> sorted posting list of doc ids) from a small corpus
-- in SQL, then answers conjunctive (AND) queries with list_intersect_agg and list_intersect.

CREATE EXTERNAL TABLE docs (doc_id INT UNSIGNED, text VARCHAR)
STORED AS CSV LOCATION 'examples/data/docs.csv' OPTIONS ('format.has_header' 'true');

-- Tokenize: lowercase alphanumeric words. One row per (term, doc).
CREATE VIEW tokens AS
SELECT DISTINCT doc_id, term
FROM (SELECT doc_id, unnest(string_to_array(regexp_replace(lower(text), '[^a-z0-9]+', ' ', 'g'), ' ')) AS term FROM docs)
WHERE term <> '';

-- The postings table: every term with its ascending list of document ids.
CREATE TABLE postings AS
SELECT term, array_sort(array_agg(doc_id)) AS doc_ids
FROM tokens GROUP BY term;

SELECT count(*) AS terms, sum(cardinality(doc_ids)) AS postings FROM postings;

-- AND query "set intersection": the documents that contain both terms.
SELECT list_intersect_agg(doc_ids) AS docs, cardinality(list_intersect_agg(doc_ids)) AS n
FROM postings WHERE term IN ('set', 'intersection');

-- AND query over three terms, with the matching texts.
SELECT d.doc_id, d.text
FROM (SELECT unnest(list_intersect_agg(doc_ids)) AS doc_id
      FROM postings WHERE term IN ('posting', 'lists', 'sorted')) AS hits
JOIN docs d USING (doc_id)
ORDER BY d.doc_id;

-- Pairwise: for each pair of terms, how many documents they share (k-way list_intersect).
SELECT a.term AS t1, b.term AS t2, list_intersect(a.doc_ids, b.doc_ids) AS shared,
       list_intersect_count(a.doc_ids, b.doc_ids) AS n
FROM postings a JOIN postings b ON a.term < b.term
WHERE a.term IN ('query', 'search', 'gpu', 'conjunctive') AND b.term IN ('query', 'search', 'gpu', 'conjunctive')
ORDER BY n DESC, t1, t2;

-- Three-way intersection in one call, shortest list first.
SELECT list_intersect(
  (SELECT doc_ids FROM postings WHERE term = 'the'),
  (SELECT doc_ids FROM postings WHERE term = 'of'),
  (SELECT doc_ids FROM postings WHERE term = 'intersection')) AS docs;

-- The options in force.
SELECT name, value FROM information_schema.df_settings WHERE name LIKE 'sets.%' ORDER BY name;
