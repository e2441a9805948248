"""The HTTP server ``estafeta serve`` runs and the operator console it serves, for any app.

Apart from :mod:`cli` (the click commands) so that the commands a shell runs need none of
FastAPI, Starlette or Jinja2: ``cli.serve`` imports the server only when it serves. The
modules are grouped by what they do:

- :mod:`console.server`: the ASGI app (an app's API, ``/health``, problem documents, the
  console's own listener) and the console's sign-in throttle;
- :mod:`console.pages`: the console's routes, pages and actions, and their templates;
- :mod:`console.charts`: the charts over a window, drawn as SVG on the server;
- :mod:`console.saga_diagram` and :mod:`console.saga_labels`: a saga kind drawn from its
  declaration, and its compensations named by the commands they send;
- :mod:`console.data`: what the pages show, read from every service's database.

Importing this package (or :mod:`console.data`, :mod:`console.saga_labels`) imports no web
framework: ``estafeta sagas show`` and ``estafeta events show`` use them without the
``http`` extra.
"""
