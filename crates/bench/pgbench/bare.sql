-- The bare handler: one INSERT.
INSERT INTO bench_orders (customer_id, total_cents) VALUES ('c_1', 4000) RETURNING id;
