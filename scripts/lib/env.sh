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
