"""The databases: connection pools, migrations, and the outbox, inbox and saga stores.

Everything here takes explicit parameters (a DSN, a connection, a schema name) and
never reads settings: the caller decides which service's database it talks to.
"""
