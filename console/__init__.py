"""The HTTP server ``estafeta serve`` runs and the operator console it serves, for any app.

Apart from :mod:`cli` (the click commands) so that the commands a shell runs need none of
FastAPI, Starlette or Jinja2: ``estafeta_cli.serve`` imports the server only when it serves. The
modules are grouped by what they do:

- :mod:`estafeta_console.server`: the ASGI app (an app's API, ``/health``, problem documents, the
  console's own listener) and the console's sign-in throttle;
- :mod:`estafeta_console.pages`: the console's routes, pages and actions, and their templates;
- :mod:`estafeta_console.charts`: the charts over a window, drawn as SVG on the server;
- :mod:`estafeta_console.saga_diagram` and :mod:`estafeta_console.saga_labels`: a saga kind drawn from its
  declaration, and its compensations named by the commands they send;
- :mod:`estafeta_console.data`: what the pages show, read from every service's database.

Importing this package (or :mod:`estafeta_console.data`, :mod:`estafeta_console.saga_labels`) imports no web
framework: ``estafeta sagas show`` and ``estafeta events show`` use them without the
``http`` extra.
"""
