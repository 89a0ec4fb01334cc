-- datafusion-sets quickstart. From the repository root:
--   cargo run --release --features cli -- -f examples/quickstart.sql
--
-- The corpus: the 764 binary packages of Debian 12 (main, amd64) in the sections database,
-- httpd and mail, from Debian's own package index (examples/data/README.md). Each package
-- has a one-line description and the names it depends on.

CREATE EXTERNAL TABLE packages STORED AS JSON LOCATION 'examples/data/debian-packages.json';

SELECT section, count(*) AS packages FROM packages GROUP BY section ORDER BY section;

-- 1. BM25 search over the descriptions --------------------------------------------------

-- The index is a plain table: one row per term (its postings, frequencies, lengths).
CREATE TABLE idx AS
SELECT * FROM bm25_index('packages', 'id', 'description', 'stopwords=english, stem=english');

SELECT count(*) AS terms, sum(cardinality(doc_ids)) AS postings, max(n_docs) AS documents FROM idx;

-- One query, the table form: (rank, doc_id, score), best first.
SELECT r.rank, p.package, round(r.score, 3) AS score, p.description
FROM topk_bm25('idx', 'IMAP server', 5) r JOIN packages p ON p.id = r.doc_id
ORDER BY r.rank;

-- A column of queries at once, the scalar form: each row's top 2 holding every term.
CREATE TABLE queries (qid INT, query VARCHAR) AS VALUES
  (1, 'spam filter'), (2, 'web proxy server'), (3, 'full-text search');

SELECT q.qid, q.query, p.package, round(q.hit['score'], 3) AS score
FROM (SELECT qid, query, unnest(topk_bm25('idx', query, 2, 'and')) AS hit FROM queries) q
JOIN packages p ON p.id = q.hit['doc_id']
ORDER BY q.qid, score DESC, p.package;

-- 2. Similarity join over dependency sets -------------------------------------------------

-- Number the dependency names; each package's dependencies as a sorted list of ids.
CREATE TABLE dep_names AS
SELECT row_number() OVER (ORDER BY name) AS dep_id, name
FROM (SELECT DISTINCT unnest(depends) AS name FROM packages);

CREATE TABLE deps AS
SELECT p.id, p.package, array_sort(array_agg(d.dep_id)) AS dep_ids
FROM (SELECT id, package, unnest(depends) AS name FROM packages) p JOIN dep_names d USING (name)
GROUP BY p.id, p.package;

-- Every pair of packages whose dependency sets have a Jaccard similarity of at least 0.8,
-- as a table function (a self-join: each pair once); the large near-duplicates.
SELECT a.package AS package_a, b.package AS package_b, round(j.similarity, 3) AS jaccard,
       cardinality(a.dep_ids) AS deps_a, cardinality(b.dep_ids) AS deps_b
FROM similarity_join('deps', 'id', 'dep_ids', 'jaccard', 0.8) j
JOIN deps a ON a.id = j.left_id JOIN deps b ON b.id = j.right_id
WHERE cardinality(a.dep_ids) >= 8 AND cardinality(b.dep_ids) >= 8
ORDER BY jaccard DESC, package_a, package_b;

-- The same join written in SQL (planned as the same operator, not a nested loop).
SELECT count(*) AS pairs, count(*) FILTER (WHERE jaccard(a.dep_ids, b.dep_ids) = 1) AS identical
FROM deps a JOIN deps b ON jaccard(a.dep_ids, b.dep_ids) >= 0.8 AND a.id < b.id;

-- 3. List intersection ----------------------------------------------------------------

-- What two packages both depend on: the count over the id lists, the names themselves.
SELECT v.a, v.b, list_intersect_count(a.dep_ids, b.dep_ids) AS common,
       round(jaccard(a.dep_ids, b.dep_ids), 3) AS jaccard, list_intersect(pa.depends, pb.depends) AS names
FROM (VALUES ('postfix', 'exim4-daemon-light'), ('postgresql-15', 'mariadb-server-core')) AS v(a, b)
JOIN deps a ON a.package = v.a JOIN deps b ON b.package = v.b
JOIN packages pa ON pa.id = a.id JOIN packages pb ON pb.id = b.id
ORDER BY common DESC;

-- Reverse dependencies as posting lists: for each name, the sorted ids of its dependents.
CREATE TABLE rdeps AS
SELECT name, array_sort(array_agg(id)) AS ids
FROM (SELECT id, unnest(depends) AS name FROM packages) GROUP BY name;

-- A conjunctive query: the packages that need the PostgreSQL, MariaDB and SQLite clients.
SELECT p.package, p.description
FROM (SELECT unnest(list_intersect_agg(ids)) AS id FROM rdeps
      WHERE name IN ('libpq5', 'libmariadb3', 'libsqlite3-0')) hits
JOIN packages p USING (id)
ORDER BY p.package;

-- Many conjunctive queries in one statement: GROUP BY over a (question, dependency) table.
CREATE TABLE asks (ask INT, name VARCHAR) AS VALUES
  (1, 'libssl3'), (1, 'libsasl2-2'), (2, 'perl'), (2, 'libdbi-perl'), (3, 'libpq5'), (3, 'libldap-2.5-0');

SELECT a.ask, array_sort(array_agg(a.name)) AS depends_on_all,
       cardinality(list_intersect_agg(r.ids)) AS packages
FROM asks a JOIN rdeps r USING (name)
GROUP BY a.ask ORDER BY a.ask;
