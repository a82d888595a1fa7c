# Shared by scripts/test and scripts/bench: finds or starts the Redis and PostgreSQL
# servers the tests need, and a three-node Redis Cluster. Source it after env.sh.
#
# For each server: the URL in the environment if set (REDIS_TEST_URL, POSTGRES_TEST_URL,
# REDIS_CLUSTER_TEST_URLS); otherwise the machine's local server if it answers
# (127.0.0.1:6379; 127.0.0.1:5432, database `test`, user postgres or root); otherwise a
# private throwaway server started from the binaries on PATH on a free port, stopped by
# its pid when the script exits. If none of that works, the script stops and names what
# to install. Each run writes under its own Redis key prefix and PostgreSQL schema, and
# removes them when it exits. IDEM_PRIVATE_SERVERS=1 skips the local servers (to try the
# fresh-machine path).

RUN_ID="run$$x$(date +%s)"
SERVERS_DIR=$(mktemp -d "${TMPDIR:-/tmp}/idem-servers.XXXXXX")
at_exit "rm -rf '$SERVERS_DIR'"

# A free 127.0.0.1 port whose cluster bus port (port + 10000) is free too.
free_port() {
  python3 - <<'EOF'
import random, socket
for _ in range(200):
    port = random.randint(20000, 29999)
    try:
        for p in (port, port + 10000):
            s = socket.socket(); s.bind(("127.0.0.1", p)); s.close()
        print(port); break
    except OSError:
        pass
EOF
}

need() {
  command -v "$1" >/dev/null 2>&1 || {
    echo "error: $1 is not on PATH and no $2 server answers. $3" >&2
    exit 1
  }
}

REDIS_INSTALL="Install Redis 7 (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis), start one on 127.0.0.1:6379, or set REDIS_TEST_URL."

# The private-redis binary (crates/test-support/src/bin/private-redis.rs): the one
# launcher of private redis-servers, which the tests use too. Built on first use.
PRIVATE_REDIS=""
private_redis_bin() {
  if [ -z "$PRIVATE_REDIS" ]; then
    echo "==> building the private-redis launcher (test-support)" >&2
    cargo build --quiet -p test-support --no-default-features --bin private-redis >&2
    PRIVATE_REDIS="${CARGO_TARGET_DIR:-target}/debug/private-redis"
  fi
}

# Starts a private redis-server (nothing on disk) on a free port through private-redis;
# extra arguments are passed on. Sets PRIVATE_PORT (not a subshell: the stop action must be
# registered here).
start_private_redis() {
  local port_file pid port
  private_redis_bin
  port_file=$(mktemp "$SERVERS_DIR/port.XXXXXX")
  rm -f "$port_file"
  "$PRIVATE_REDIS" --dir "$SERVERS_DIR" --port-file "$port_file" -- "$@" &
  pid=$!
  at_exit "kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true"
  for _ in $(seq 1 100); do
    if [ -s "$port_file" ]; then
      port=$(cat "$port_file")
      redis-cli -p "$port" ping >/dev/null 2>&1 && { PRIVATE_PORT=$port; return; }
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  echo "error: the private redis-server did not start:" >&2
  [ -n "${port:-}" ] && cat "$SERVERS_DIR/redis-$port/log" >&2
  exit 1
}

ensure_redis() {
  if [ -n "${REDIS_TEST_URL:-}" ]; then
    echo "==> Redis: REDIS_TEST_URL=$REDIS_TEST_URL"
  elif [ -z "${IDEM_PRIVATE_SERVERS:-}" ] && command -v redis-cli >/dev/null 2>&1 && [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = PONG ]; then
    export REDIS_TEST_URL="redis://127.0.0.1:6379"
    echo "==> Redis: the local server at $REDIS_TEST_URL"
  else
    need redis-server Redis "$REDIS_INSTALL"
    need redis-cli Redis "$REDIS_INSTALL"
    start_private_redis
    export REDIS_TEST_URL="redis://127.0.0.1:$PRIVATE_PORT"
    echo "==> Redis: a private server at $REDIS_TEST_URL"
  fi
  export REDIS_TEST_PREFIX="idem-test:$RUN_ID:"
  if command -v redis-cli >/dev/null 2>&1; then
    at_exit "redis-cli -u '$REDIS_TEST_URL' --scan --pattern '${REDIS_TEST_PREFIX}*' 2>/dev/null | tr '\\n' '\\0' | xargs -0 -r -n 500 redis-cli -u '$REDIS_TEST_URL' del >/dev/null 2>&1 || true"
  fi
}

# Three masters, no replicas, on free ports: about a second.
start_redis_cluster() {
  if [ -n "${REDIS_CLUSTER_TEST_URLS:-}" ]; then
    echo "==> Redis Cluster: REDIS_CLUSTER_TEST_URLS=$REDIS_CLUSTER_TEST_URLS"
    return
  fi
  need redis-server "Redis Cluster" "$REDIS_INSTALL"
  need redis-cli "Redis Cluster" "$REDIS_INSTALL"
  local ports=() urls=() port
  for _ in 1 2 3; do
    start_private_redis --cluster-enabled yes --cluster-config-file nodes.conf \
      --cluster-node-timeout 2000
    port=$PRIVATE_PORT
    ports+=("$port")
    urls+=("redis://127.0.0.1:$port")
  done
  redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes \
    > "$SERVERS_DIR/cluster-create.log" 2>&1 || {
    echo "error: redis-cli --cluster create failed:" >&2
    cat "$SERVERS_DIR/cluster-create.log" >&2
    exit 1
  }
  for port in "${ports[@]}"; do
    for _ in $(seq 1 100); do
      redis-cli -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' && break
      sleep 0.05
    done
    redis-cli -p "$port" cluster info | grep -q '^cluster_state:ok' || {
      echo "error: the Redis cluster did not become ready (node $port)" >&2
      exit 1
    }
  done
  REDIS_CLUSTER_TEST_URLS=$(IFS=,; echo "${urls[*]}")
  export REDIS_CLUSTER_TEST_URLS
  echo "==> Redis Cluster: three private nodes at $REDIS_CLUSTER_TEST_URLS"
}

POSTGRES_INSTALL="Install PostgreSQL 15 or later (Debian/Ubuntu: apt-get install postgresql; macOS: brew install postgresql), run one on 127.0.0.1:5432 with a database test, or set POSTGRES_TEST_URL."

# The directory that holds initdb and pg_ctl: PATH first, then Debian's versioned dirs.
postgres_bin_dir() {
  if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
    dirname "$(command -v initdb)"
    return
  fi
  local dir
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && { echo "$dir"; return; }
  done
}

# Starts a private PostgreSQL on a free port (as a non-root user: initdb refuses root).
start_private_postgres() {
  local bin port dir as=()
  bin=$(postgres_bin_dir)
  [ -n "$bin" ] || { echo "error: no PostgreSQL server answers and initdb/pg_ctl are not installed. $POSTGRES_INSTALL" >&2; exit 1; }
  port=$(free_port)
  dir="$SERVERS_DIR/postgres-$port"
  mkdir -p "$dir"
  if [ "$(id -u)" = 0 ]; then
    # Run the server as `nobody`, from a directory it owns.
    chmod 755 "$SERVERS_DIR"
    chown nobody "$dir"
    # nobody's own group: `nogroup` on Debian, `nobody` on Fedora and Amazon Linux.
    as=(setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups --)
  fi
  "${as[@]}" "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 > "$dir/initdb.log" 2>&1 || {
    echo "error: initdb failed:" >&2; cat "$dir/initdb.log" >&2; exit 1; }
  # Registered first: a start that times out may leave a server running.
  at_exit "${as[*]} '$bin/pg_ctl' -D '$dir/data' -m immediate stop >/dev/null 2>&1 || true"
  "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off" start > /dev/null || {
    echo "error: pg_ctl start failed:" >&2; cat "$dir/log" >&2; exit 1; }
  "${as[@]}" "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres test 2>/dev/null \
    || psql "postgres://postgres@127.0.0.1:$port/postgres" -qc 'CREATE DATABASE test' >/dev/null
  PRIVATE_PORT=$port
}

ensure_postgres() {
  if [ -n "${POSTGRES_TEST_URL:-}" ]; then
    echo "==> PostgreSQL: POSTGRES_TEST_URL=$POSTGRES_TEST_URL"
  else
    local url
    for url in postgres://postgres@127.0.0.1:5432/test postgres://root@127.0.0.1:5432/test; do
      if [ -z "${IDEM_PRIVATE_SERVERS:-}" ] && command -v psql >/dev/null 2>&1 && psql "$url" -qAtc 'select 1' >/dev/null 2>&1; then
        export POSTGRES_TEST_URL="$url"
        break
      fi
    done
    if [ -n "${POSTGRES_TEST_URL:-}" ]; then
      echo "==> PostgreSQL: the local server at $POSTGRES_TEST_URL"
    else
      start_private_postgres
      export POSTGRES_TEST_URL="postgres://postgres@127.0.0.1:$PRIVATE_PORT/test"
      echo "==> PostgreSQL: a private server at $POSTGRES_TEST_URL"
    fi
  fi
  # Every table this run's tests make goes into this schema, dropped at exit.
  export POSTGRES_TEST_SCHEMA="idem_test_$RUN_ID"
  if command -v psql >/dev/null 2>&1; then
    psql "$POSTGRES_TEST_URL" -qc "CREATE SCHEMA IF NOT EXISTS $POSTGRES_TEST_SCHEMA" >/dev/null
    at_exit "psql '$POSTGRES_TEST_URL' -qc 'DROP SCHEMA IF EXISTS $POSTGRES_TEST_SCHEMA CASCADE' >/dev/null 2>&1 || true"
  fi
}
