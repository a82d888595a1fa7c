# Shared by scripts/test and scripts/bench: the Python tools in .venv and the local
# DynamoDB test server. Source it from the repository root.

VENV=${VENV:-.venv}

# Cleanups run when the sourcing script exits, the last registered first.
EXIT_ACTIONS=()
at_exit() {
  EXIT_ACTIONS=("$1" "${EXIT_ACTIONS[@]}")
}
run_exit_actions() {
  local action
  for action in "${EXIT_ACTIONS[@]}"; do eval "$action" || true; done
}
trap run_exit_actions EXIT

# Creates .venv if needed and installs the pinned tools (a no-op when they are there).
ensure_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    echo "==> creating $VENV"
    python3 -m venv "$VENV"
  fi
  echo "==> installing the pinned Python tools (tests/servers/requirements.txt)"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r tests/servers/requirements.txt
}

# Starts the DynamoDB test server on a free 127.0.0.1 port, exports DYNAMODB_TEST_ENDPOINT
# and stops the server by its pid when the calling script exits.
start_dynamodb_server() {
  mkdir -p target
  DYNAMODB_PORT_FILE=$(mktemp)
  rm -f "$DYNAMODB_PORT_FILE"
  "$VENV/bin/python" tests/servers/dynamodb_server.py --port 0 --port-file "$DYNAMODB_PORT_FILE" \
    > target/dynamodb-server.log 2>&1 &
  DYNAMODB_SERVER_PID=$!
  at_exit "kill $DYNAMODB_SERVER_PID 2>/dev/null || true; wait $DYNAMODB_SERVER_PID 2>/dev/null || true; rm -f '$DYNAMODB_PORT_FILE'"
  for _ in $(seq 1 300); do
    [ -s "$DYNAMODB_PORT_FILE" ] && break
    if ! kill -0 "$DYNAMODB_SERVER_PID" 2>/dev/null; then
      echo "the DynamoDB test server did not start:" >&2
      cat target/dynamodb-server.log >&2
      exit 1
    fi
    sleep 0.1
  done
  [ -s "$DYNAMODB_PORT_FILE" ] || { echo "the DynamoDB test server did not start within 30 s" >&2; exit 1; }
  export DYNAMODB_TEST_ENDPOINT="http://127.0.0.1:$(cat "$DYNAMODB_PORT_FILE")"
  echo "==> DynamoDB test server at $DYNAMODB_TEST_ENDPOINT (pid $DYNAMODB_SERVER_PID)"
}

# dynalite, the second DynamoDB emulator (it validates requests and expressions more
# strictly than moto): installed once from npm into target/dynalite (about 10 MB, seconds),
# reinstalled only when the pinned version changes.
DYNALITE_VERSION=4.0.0
DYNALITE_DIR=${DYNALITE_DIR:-target/dynalite}

# Installs dynalite if needed, starts it on a free 127.0.0.1 port with tables active at
# once, exports DYNALITE_TEST_ENDPOINT and stops it by its pid when the calling script
# exits.
start_dynalite() {
  local installed="" port
  command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1 || {
    echo "error: the dynalite DynamoDB emulator needs Node.js 18 or later and npm (Debian/Ubuntu: apt-get install nodejs npm; macOS: brew install node)" >&2
    exit 1
  }
  mkdir -p "$DYNALITE_DIR"
  [ -f "$DYNALITE_DIR/node_modules/dynalite/package.json" ] &&
    installed=$(node -p 'require(require("path").resolve(process.argv[1])).version' \
      "$DYNALITE_DIR/node_modules/dynalite/package.json")
  if [ "$installed" != "$DYNALITE_VERSION" ]; then
    echo "==> installing dynalite $DYNALITE_VERSION into $DYNALITE_DIR (npm)"
    npm install --prefix "$DYNALITE_DIR" --no-save --no-audit --no-fund --loglevel=error \
      "dynalite@$DYNALITE_VERSION" > target/dynalite-install.log 2>&1 || {
      echo "error: npm install dynalite@$DYNALITE_VERSION failed:" >&2
      cat target/dynalite-install.log >&2
      exit 1
    }
  fi
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
  "$DYNALITE_DIR/node_modules/.bin/dynalite" --host 127.0.0.1 --port "$port" \
    --createTableMs 0 --deleteTableMs 0 --updateTableMs 0 > target/dynalite.log 2>&1 &
  DYNALITE_PID=$!
  at_exit "kill $DYNALITE_PID 2>/dev/null || true; wait $DYNALITE_PID 2>/dev/null || true"
  for _ in $(seq 1 100); do
    grep -q "listening" target/dynalite.log 2>/dev/null && break
    if ! kill -0 "$DYNALITE_PID" 2>/dev/null; then
      echo "error: dynalite did not start:" >&2
      cat target/dynalite.log >&2
      exit 1
    fi
    sleep 0.1
  done
  grep -q "listening" target/dynalite.log || { echo "error: dynalite did not start within 10 s" >&2; exit 1; }
  export DYNALITE_TEST_ENDPOINT="http://127.0.0.1:$port"
  echo "==> dynalite $DYNALITE_VERSION at $DYNALITE_TEST_ENDPOINT (pid $DYNALITE_PID)"
}
