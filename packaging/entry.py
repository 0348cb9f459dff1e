"""The frozen program's entry point: the same ``main`` as the ``oam-bridge`` console script."""

from bridge.jsonrpc.main import main

raise SystemExit(main())
