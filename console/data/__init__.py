"""What the console's pages show, read from every service's database of an app.

Read, never routed: :mod:`estafeta_console.data.overview` (the front page and one saga),
:mod:`estafeta_console.data.lists` (sagas, dead-letter groups and failed rows, filtered and paged),
:mod:`estafeta_console.data.read_models` (projections, event streams, scheduled messages) and
:mod:`estafeta_console.data.aggregates` (a stream's aggregate, also shown by ``estafeta events show``).
"""
