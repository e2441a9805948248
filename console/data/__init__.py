"""What the console's pages show, read from every service's database of an app.

Read, never routed: :mod:`console.data.overview` (the front page and one saga),
:mod:`console.data.lists` (sagas, dead-letter groups and failed rows, filtered and paged),
:mod:`console.data.read_models` (projections, event streams, scheduled messages) and
:mod:`console.data.aggregates` (a stream's aggregate, also shown by ``estafeta events show``).
"""
