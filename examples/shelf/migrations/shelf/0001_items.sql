-- The shelf service's business table, mapped by the SQLAlchemy ORM in tests/shelf.py.
CREATE TABLE items (
    item_id uuid PRIMARY KEY,
    name text NOT NULL UNIQUE,
    quantity integer NOT NULL DEFAULT 0 CHECK (quantity >= 0)
);
