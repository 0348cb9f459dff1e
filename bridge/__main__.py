from bridge.jsonrpc.main import main

raise SystemExit(main())
