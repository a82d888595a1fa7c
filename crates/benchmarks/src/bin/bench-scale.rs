//! How the stores behave as Lambda environments multiply: claims and completions per
//! second against concurrency (each worker with its own connection, as each Lambda
//! environment has), on Redis, a Redis Cluster and PostgreSQL, with all-distinct keys and
//! with one hot key, against the same atomic work without the library (a loop on the
//! store's own client crate and connection) and the store's own tool (pgbench,
//! redis-benchmark), in turn in every round; the CPU each takes per message; then volume:
//! a million records in each store.
//!
//! `cargo run --release -p benchmarks --bin bench-scale` (scripts/bench runs it with the
//! servers). `SCALE_LEVELS=1,4,16`, `SCALE_ROUNDS=3` (default 5) and `SCALE_SECONDS=1`
//! (default 2, per round and variant) shorten it, `SCALE_STORES=redis` (or
//! `redis-cluster`, `postgres`, comma-separated) picks stores, `SCALE_RECORDS` changes the
//! volume (default 1000000; 0 skips it).

use lambda_idempotency::store::IdempotencyStore;
use lambda_idempotency::store::postgres::PostgresStore;
use lambda_idempotency::store::redis::RedisStore;
use lambda_idempotency::{Idempotency, KeyStrategy, Operation};
use serde_json::json;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use test_support::servers::{postgres_url, redis_cluster_urls, redis_url};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Store {
    Redis,
    RedisCluster,
    Postgres,
}

impl Store {
    fn name(self) -> &'static str {
        match self {
            Store::Redis => "Redis",
            Store::RedisCluster => "Redis Cluster (3 nodes)",
            Store::Postgres => "PostgreSQL",
        }
    }
}

/// One timed run of one variant (the library, the raw loop, or the store's tool): its
/// rate, its claims' latencies, and the CPU it took per message.
#[derive(Default)]
struct Sample {
    /// Messages per second (for redis-benchmark, claim scripts per second).
    rate: f64,
    /// Each claim's round trip, where the variant times them.
    claims: Vec<Duration>,
    /// The p99 the tool reports, in ms, where it times itself.
    reported_p99: Option<f64>,
    /// CPU of this process (or of the tool, a child it waited for), per message, µs.
    client_us: f64,
    /// CPU of the Redis server per message, µs (a single node only).
    server_us: Option<f64>,
    in_progress: u64,
    errors: u64,
}

impl Sample {
    fn p99_ms(&self) -> Option<f64> {
        self.reported_p99.or_else(|| {
            (!self.claims.is_empty()).then(|| pick(&self.claims, 0.99).as_secs_f64() * 1e3)
        })
    }
}

/// The `q` quantile of sorted durations.
fn pick(sorted: &[Duration], q: f64) -> Duration {
    sorted
        .get(((sorted.len().max(1) - 1) as f64 * q) as usize)
        .copied()
        .unwrap_or_default()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// CPU counters, read before and after a run: this process's (children it waited for
/// included, so a tool's run counts) and, for Redis, the server's (`INFO cpu`).
struct Cpu {
    own: Duration,
    server: Option<Duration>,
}

impl Cpu {
    async fn read(kind: Store) -> Cpu {
        Cpu {
            own: process_cpu(),
            server: match kind {
                Store::Redis => redis_server_cpu().await,
                _ => None,
            },
        }
    }

    /// Fills `sample`'s CPU per message for `messages` messages since `self`.
    async fn charge(self, kind: Store, messages: u64, sample: &mut Sample) {
        let now = Cpu::read(kind).await;
        let per = |d: Duration| d.as_secs_f64() * 1e6 / messages.max(1) as f64;
        sample.client_us = per(now.own.saturating_sub(self.own));
        sample.server_us = match (self.server, now.server) {
            (Some(before), Some(after)) => Some(per(after.saturating_sub(before))),
            _ => None,
        };
    }
}

/// This process's CPU (user and system), and that of the children it waited for, from
/// `/proc/self/stat` (Linux; ticks of 10 ms: a run of seconds reads to about 1 %).
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // After the command's closing parenthesis: field 3 (state) first, so utime (14),
    // stime, cutime and cstime (17) are the 12th to 15th.
    let ticks: u64 = stat
        .rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .skip(11)
                .take(4)
                .filter_map(|f| f.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// The Redis server's CPU so far (`used_cpu_user` + `used_cpu_sys`).
async fn redis_server_cpu() -> Option<Duration> {
    let client = redis::Client::open(redis_url()).ok()?;
    let mut connection = client.get_multiplexed_async_connection().await.ok()?;
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(&mut connection)
        .await
        .ok()?;
    let seconds: f64 = info
        .lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_user:")
                .or_else(|| l.strip_prefix("used_cpu_sys:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum();
    Some(Duration::from_secs_f64(seconds))
}

fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// A store of `kind` with a connection of its own, under `scope` (a namespace or table).
async fn open(kind: Store, scope: &str) -> Result<Arc<dyn IdempotencyStore>, String> {
    Ok(match kind {
        Store::Redis => Arc::new(
            RedisStore::connect(&redis_url())
                .await
                .map_err(|e| e.to_string())?
                .namespace(scope.to_owned()),
        ),
        Store::RedisCluster => Arc::new(
            RedisStore::connect_cluster(redis_cluster_urls())
                .await
                .map_err(|e| e.to_string())?
                .namespace(scope.to_owned()),
        ),
        Store::Postgres => {
            let store =
                PostgresStore::from_url(&postgres_url(), scope).map_err(|e| e.to_string())?;
            store
                .ensure_connected()
                .await
                .map_err(|e| lambda_idempotency::report(&e))?;
            Arc::new(store)
        }
    })
}

/// `workers` workers, each with its own connection, run messages through the library for
/// `seconds`: each a claim and a completion (distinct keys), or a claim answered by the
/// stored result (one hot key, after its first run). Claims are timed by a wrapper around
/// the store.
async fn run_level(
    kind: Store,
    scope: &str,
    workers: usize,
    seconds: u64,
    hot: bool,
) -> Result<Sample, String> {
    let mut stores = Vec::with_capacity(workers);
    for _ in 0..workers {
        stores.push(open(kind, scope).await?);
    }
    let op = Operation::new("scale", KeyStrategy::field("id"));
    let run = format!("{}", now_ms());
    // One message per connection before the clock starts: connects, and prepares the
    // statements, as the raw run does before its clock.
    for (w, store) in stores.iter().enumerate() {
        let warm = Idempotency::builder(store.clone())
            .function_name("bench")
            .build();
        warm.execute(&op, &json!({"id": format!("warm-{run}-{w}")}), || async {
            Ok::<_, String>(1u8)
        })
        .await
        .map_err(|e| e.to_string())?;
    }
    let cpu = Cpu::read(kind).await;
    let until = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (w, store) in stores.into_iter().enumerate() {
        let op = op.clone();
        let run = run.clone();
        tasks.push(tokio::spawn(async move {
            let timed = Timed::new(store);
            let idempotency = Idempotency::builder(timed.clone())
                .function_name("bench")
                .build();
            let (mut n, mut errors, mut in_progress) = (0u64, 0u64, 0u64);
            while Instant::now() < until {
                let id = if hot {
                    format!("hot-{run}")
                } else {
                    format!("{run}-{w}-{n}")
                };
                let answer = idempotency
                    .execute(&op, &json!({"id": id}), || async { Ok::<_, String>(1u8) })
                    .await;
                match answer {
                    Ok(_) => n += 1,
                    // The hot key's first call still running: handed back, as in SQS.
                    Err(lambda_idempotency::ExecuteError::Idempotency(
                        lambda_idempotency::Error::AlreadyInProgress { .. },
                    )) => in_progress += 1,
                    Err(e) => {
                        errors += 1;
                        if errors == 1 {
                            eprintln!("worker {w}: {e}");
                        }
                    }
                }
            }
            (n, errors, in_progress, timed.claims())
        }));
    }
    let mut sample = Sample::default();
    let mut messages = 0;
    for task in tasks {
        let (n, e, p, c) = task.await.map_err(|e| e.to_string())?;
        messages += n;
        sample.errors += e;
        sample.in_progress += p;
        sample.claims.extend(c);
    }
    sample.rate = messages as f64 / started.elapsed().as_secs_f64();
    sample.claims.sort_unstable();
    cpu.charge(kind, messages, &mut sample).await;
    Ok(sample)
}

/// A store wrapper that times every claim.
#[derive(Debug, Clone)]
struct Timed {
    inner: Arc<dyn IdempotencyStore>,
    claims: Arc<std::sync::Mutex<Vec<Duration>>>,
}

impl Timed {
    fn new(inner: Arc<dyn IdempotencyStore>) -> Self {
        Timed {
            inner,
            claims: Arc::default(),
        }
    }

    fn claims(&self) -> Vec<Duration> {
        std::mem::take(&mut self.claims.lock().unwrap())
    }
}

impl IdempotencyStore for Timed {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn limits(&self) -> lambda_idempotency::store::StoreLimits {
        self.inner.limits()
    }
    fn claim<'a>(
        &'a self,
        claim: &'a lambda_idempotency::store::Claim,
    ) -> lambda_idempotency::store::BoxFuture<
        'a,
        Result<lambda_idempotency::store::ClaimOutcome, lambda_idempotency::Error>,
    > {
        Box::pin(async move {
            let started = Instant::now();
            let answer = self.inner.claim(claim).await;
            self.claims.lock().unwrap().push(started.elapsed());
            answer
        })
    }
    fn complete<'a>(
        &'a self,
        claim: &'a lambda_idempotency::store::Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
    ) -> lambda_idempotency::store::BoxFuture<'a, Result<(), lambda_idempotency::Error>> {
        self.inner.complete(claim, data, expiration)
    }
    fn release<'a>(
        &'a self,
        claim: &'a lambda_idempotency::store::Claim,
    ) -> lambda_idempotency::store::BoxFuture<'a, Result<(), lambda_idempotency::Error>> {
        self.inner.release(claim)
    }
    fn get<'a>(
        &'a self,
        id: &'a str,
    ) -> lambda_idempotency::store::BoxFuture<
        'a,
        Result<Option<lambda_idempotency::store::Record>, lambda_idempotency::Error>,
    > {
        self.inner.get(id)
    }
}

/// The same messages without the library, on the client crate the store uses and a
/// connection per worker: the store's own claim and completion, nothing else.
async fn raw(kind: Store, workers: usize, seconds: u64, hot: bool) -> Option<Sample> {
    match kind {
        Store::Redis => raw_redis_messages(workers, seconds, hot).await,
        Store::Postgres => raw_postgres_messages(workers, seconds, hot).await,
        Store::RedisCluster => None,
    }
}

/// The store's own tool: pgbench running the store's statements as messages, or
/// redis-benchmark calling the claim script alone (its own ceiling for one script).
async fn tool(kind: Store, workers: usize, seconds: u64, hot: bool) -> Option<Sample> {
    let cpu = Cpu::read(kind).await;
    let (mut sample, messages) = match kind {
        Store::Redis => redis_benchmark(workers, seconds, hot)?,
        Store::Postgres => pgbench(workers, seconds, hot)?,
        Store::RedisCluster => return None,
    };
    cpu.charge(kind, messages, &mut sample).await;
    Some(sample)
}

fn host_port(url: &str) -> (String, String) {
    let rest = url.split("://").nth(1).unwrap_or(url);
    let rest = rest.rsplit('@').next().unwrap_or(rest);
    let host_port = rest.split('/').next().unwrap_or(rest);
    let (host, port) = host_port.rsplit_once(':').unwrap_or((host_port, "6379"));
    (host.to_owned(), port.to_owned())
}

/// redis-benchmark calling the claim script: random keys, or one key in progress.
/// Returns the sample and the calls it made.
fn redis_benchmark(workers: usize, seconds: u64, hot: bool) -> Option<(Sample, u64)> {
    let (host, port) = host_port(&redis_url());
    let script = include_str!("../../../idempotency/src/store/redis/scripts/claim.lua");
    let load = Command::new("redis-cli")
        .args(["-h", &host, "-p", &port, "SCRIPT", "LOAD", script])
        .output()
        .ok()?;
    let sha = String::from_utf8_lossy(&load.stdout).trim().to_owned();
    // About as many calls as it makes in `seconds` on this machine.
    let requests = (workers as u64 * 4_000).clamp(20_000, 300_000) * seconds / 2;
    let now = now_ms();
    let key = if hot {
        "bench-raw:hot".to_owned()
    } else {
        "bench-raw:__rand_int__".to_owned()
    };
    let args = [
        "-h".to_owned(),
        host,
        "-p".to_owned(),
        port,
        "-c".to_owned(),
        workers.to_string(),
        "-n".to_owned(),
        requests.to_string(),
        "-r".to_owned(),
        "1000000000".to_owned(),
        "--csv".to_owned(),
        "EVALSHA".to_owned(),
        sha,
        "1".to_owned(),
        key,
        now.to_string(),
        (now / 1000).to_string(),
        (now / 1000 + 3600).to_string(),
        (now + 60_000).to_string(),
        "bench-token".to_owned(),
        "0".to_owned(),
        String::new(),
        (now + 3_600_000).to_string(),
    ];
    let out = Command::new("redis-benchmark").args(&args).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text.lines().find(|l| l.starts_with("\"EVALSHA"))?;
    let fields: Vec<f64> = row
        .split(',')
        .skip(1)
        .filter_map(|f| f.trim_matches('"').parse().ok())
        .collect();
    // rps, avg, min, p50, p95, p99, max
    let sample = Sample {
        rate: *fields.first()?,
        reported_p99: fields.get(5).copied(),
        ..Sample::default()
    };
    Some((sample, requests))
}

/// The store's claim and completion statements with their values filled in, for `id`
/// (an SQL expression), on the raw table.
fn raw_statements(id: &str, now: u128) -> Option<(String, String)> {
    let store = PostgresStore::from_url(&postgres_url(), RAW_TABLE).ok()?;
    let claim = store
        .claim_sql()
        .replace("$1", id)
        .replace("$2", &(now / 1000 + 3600).to_string())
        .replace("$3", &(now + 60_000).to_string())
        .replace("$4", "NULL::text")
        .replace("$5", "'bench-token'")
        .replace("$6", &(now / 1000).to_string())
        .replace("$7", &now.to_string())
        .replace('\n', " ");
    let complete = store
        .complete_sql()
        .replace("$1", id)
        .replace("$2", "'bench-token'")
        .replace("$3", "'1'")
        .replace("$4", &(now / 1000 + 3600).to_string())
        .replace('\n', " ");
    Some((claim, complete))
}

/// The table the raw runs write, beside the library's.
const RAW_TABLE: &str = "bench_scale.raw";

/// pgbench running the store's own statements, prepared as the store sends them
/// (`SCALE_PGBENCH_MODE=extended` for unnamed ones, as `prepared_statements(false)`): per
/// transaction, with distinct keys, the claim and the completion of one message; with the
/// hot key, a claim of a completed record (the replay branch, as the library's). Returns
/// the sample and the messages (transactions) it ran.
fn pgbench(workers: usize, seconds: u64, hot: bool) -> Option<(Sample, u64)> {
    let mode = std::env::var("SCALE_PGBENCH_MODE").unwrap_or_else(|_| "prepared".into());
    let now = now_ms();
    let id = if hot {
        format!("'hot-{now}'")
    } else {
        format!("('msg-{now}-' || :id)")
    };
    let (claim, complete) = raw_statements(&id, now)?;
    let script = if hot {
        // The hot record, completed once, as the library's first message leaves it.
        let prepared = Command::new("psql")
            .arg(postgres_url())
            .args(["-q", "-c", &format!("{claim}; {complete};")])
            .output()
            .ok()?;
        if !prepared.status.success() {
            return None;
        }
        format!("{claim};\n")
    } else {
        format!("\\set id random(1, 1000000000)\n{claim};\n{complete};\n")
    };
    let dir = std::env::temp_dir().join(format!("bench-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let file = dir.join("message.sql");
    std::fs::write(&file, script).ok()?;
    let out = Command::new("pgbench")
        .args([
            "-n",
            "-c",
            &workers.to_string(),
            "-j",
            "2",
            "-T",
            &seconds.to_string(),
        ])
        .args(["-M", &mode, "-f"])
        .arg(&file)
        .arg(postgres_url())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let after = |prefix: &str, nth: usize| -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(prefix))?
            .split_whitespace()
            .nth(nth)?
            .parse()
            .ok()
    };
    let rate = after("tps = ", 2)?;
    let messages = after("number of transactions actually processed:", 5)? as u64;
    Some((
        Sample {
            rate,
            ..Sample::default()
        },
        messages,
    ))
}

/// The store's own scripts without the library, on a connection per worker as the
/// library's workers have: per message, with distinct keys, `EVALSHA` of the claim script
/// then of the completion script; with the hot key, the claim of a completed record.
/// redis-benchmark cannot chain two scripts per request, so this is a loop on the client
/// crate the store uses.
async fn raw_redis_messages(workers: usize, seconds: u64, hot: bool) -> Option<Sample> {
    let client = redis::Client::open(redis_url()).ok()?;
    let scripts = RawScripts::new();
    let run = now_ms();
    let hot_key = format!("bench-raw-msg:{run}:hot");
    if hot {
        let mut connection = client.get_multiplexed_async_connection().await.ok()?;
        let now = now_ms();
        scripts.claim(&mut connection, &hot_key, now).await.ok()?;
        scripts
            .complete(&mut connection, &hot_key, now)
            .await
            .ok()?;
    }
    let mut connections = Vec::with_capacity(workers);
    for _ in 0..workers {
        connections.push(client.get_multiplexed_async_connection().await.ok()?);
    }
    let cpu = Cpu::read(Store::Redis).await;
    let until = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (w, mut connection) in connections.into_iter().enumerate() {
        let (scripts, hot_key) = (scripts.clone(), hot_key.clone());
        tasks.push(tokio::spawn(async move {
            let (mut n, mut claims) = (0u64, Vec::new());
            while Instant::now() < until {
                let now = now_ms();
                let key = if hot {
                    hot_key.clone()
                } else {
                    format!("bench-raw-msg:{run}:{w}:{n}")
                };
                let t = Instant::now();
                let claimed = scripts.claim(&mut connection, &key, now).await;
                claims.push(t.elapsed());
                if claimed.is_err()
                    || (!hot && scripts.complete(&mut connection, &key, now).await.is_err())
                {
                    return (n, claims, 1);
                }
                n += 1;
            }
            (n, claims, 0)
        }));
    }
    finish_raw(tasks, started, cpu, Store::Redis).await
}

/// Joins a raw run's workers into a sample.
async fn finish_raw(
    tasks: Vec<tokio::task::JoinHandle<(u64, Vec<Duration>, u64)>>,
    started: Instant,
    cpu: Cpu,
    kind: Store,
) -> Option<Sample> {
    let mut sample = Sample::default();
    let mut messages = 0;
    for task in tasks {
        let (n, c, e) = task.await.ok()?;
        messages += n;
        sample.claims.extend(c);
        sample.errors += e;
    }
    sample.rate = messages as f64 / started.elapsed().as_secs_f64();
    sample.claims.sort_unstable();
    cpu.charge(kind, messages, &mut sample).await;
    if sample.errors > 0 {
        // A failed worker stops: its round compares nothing.
        eprintln!("raw run: {} workers stopped on an error", sample.errors);
        return None;
    }
    Some(sample)
}

/// The store's own statements without the library, on the store's own tokio-postgres
/// connection, prepared once per connection as the store prepares them, a connection per
/// worker: per message the claim then the completion (distinct keys), or the claim of a
/// completed record (the hot key).
async fn raw_postgres_messages(workers: usize, seconds: u64, hot: bool) -> Option<Sample> {
    use tokio_postgres::types::Type;
    let store = PostgresStore::from_url(&postgres_url(), RAW_TABLE).ok()?;
    let claim_types = [
        Type::TEXT,
        Type::INT8,
        Type::INT8,
        Type::TEXT,
        Type::TEXT,
        Type::INT8,
        Type::INT8,
    ];
    let complete_types = [Type::TEXT, Type::TEXT, Type::TEXT, Type::INT8];
    let mut connections = Vec::with_capacity(workers);
    for _ in 0..workers {
        // The store's own connection (TLS where the URL asks for it, as pgbench's and the
        // library's): only the statements are sent without the library.
        let client = PostgresStore::from_url(&postgres_url(), RAW_TABLE)
            .ok()?
            .connection()
            .await
            .ok()?;
        let claim = client
            .prepare_typed(store.claim_sql(), &claim_types)
            .await
            .ok()?;
        let complete = client
            .prepare_typed(store.complete_sql(), &complete_types)
            .await
            .ok()?;
        connections.push((client, claim, complete));
    }
    let run = now_ms();
    let hot_id = format!("bench.scale#hot-{run}");
    let cpu_kind = Store::Postgres;
    if hot {
        // The hot record, completed once, as the library's first message leaves it.
        let (client, claim, complete) = connections.first()?;
        let now = now_ms() as i64;
        let no_validation: Option<String> = None;
        client
            .query(
                claim,
                &[
                    &hot_id,
                    &(now / 1000 + 3600),
                    &(now + 60_000),
                    &no_validation,
                    &"bench-token",
                    &(now / 1000),
                    &now,
                ],
            )
            .await
            .ok()?;
        client
            .query(
                complete,
                &[&hot_id, &"bench-token", &"1", &(now / 1000 + 3600)],
            )
            .await
            .ok()?;
    }
    let cpu = Cpu::read(cpu_kind).await;
    let until = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (w, (client, claim, complete)) in connections.into_iter().enumerate() {
        let hot_id = hot_id.clone();
        tasks.push(tokio::spawn(async move {
            let (mut n, mut claims) = (0u64, Vec::new());
            let no_validation: Option<String> = None;
            while Instant::now() < until {
                let now = now_ms() as i64;
                let expiration = now / 1000 + 3600;
                let id = if hot {
                    hot_id.clone()
                } else {
                    format!("bench.scale#{run}-{w}-{n}")
                };
                let t = Instant::now();
                let claimed = client
                    .query(
                        &claim,
                        &[
                            &id,
                            &expiration,
                            &(now + 60_000),
                            &no_validation,
                            &"bench-token",
                            &(now / 1000),
                            &now,
                        ],
                    )
                    .await;
                claims.push(t.elapsed());
                if claimed.is_err()
                    || (!hot
                        && client
                            .query(&complete, &[&id, &"bench-token", &"1", &expiration])
                            .await
                            .is_err())
                {
                    return (n, claims, 1);
                }
                n += 1;
            }
            (n, claims, 0)
        }));
    }
    finish_raw(tasks, started, cpu, cpu_kind).await
}

/// The store's claim and completion scripts, called as the store calls them.
#[derive(Clone)]
struct RawScripts {
    claim: redis::Script,
    complete: redis::Script,
}

impl RawScripts {
    fn new() -> Self {
        RawScripts {
            claim: redis::Script::new(include_str!(
                "../../../idempotency/src/store/redis/scripts/claim.lua"
            )),
            complete: redis::Script::new(include_str!(
                "../../../idempotency/src/store/redis/scripts/complete.lua"
            )),
        }
    }

    async fn claim(
        &self,
        connection: &mut redis::aio::MultiplexedConnection,
        key: &str,
        now: u128,
    ) -> redis::RedisResult<redis::Value> {
        self.claim
            .key(key)
            .arg(now as u64)
            .arg((now / 1000) as u64)
            .arg((now / 1000 + 3600) as u64)
            .arg((now + 60_000) as u64)
            .arg("bench-token")
            .arg("0")
            .arg("")
            .arg((now + 3_600_000) as u64)
            .invoke_async(connection)
            .await
    }

    async fn complete(
        &self,
        connection: &mut redis::aio::MultiplexedConnection,
        key: &str,
        now: u128,
    ) -> redis::RedisResult<redis::Value> {
        self.complete
            .key(key)
            .arg("bench-token")
            .arg((now / 1000 + 3600) as u64)
            .arg((now + 3_600_000) as u64)
            .arg("1")
            .arg("1")
            .invoke_async(connection)
            .await
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

/// Which tool column each store has.
fn tool_name(kind: Store) -> &'static str {
    match kind {
        Store::Redis => "redis-benchmark (claims)",
        Store::Postgres => "pgbench",
        Store::RedisCluster => "-",
    }
}

fn num(value: Option<f64>, digits: usize) -> String {
    value
        .filter(|v| v.is_finite())
        .map_or("-".to_owned(), |v| format!("{v:.digits$}"))
}

/// Every level `rounds` times, the library, the raw loop and the tool one after another
/// in each round, so that a slow spell of a shared machine falls on all three: rates and
/// CPU are medians over the rounds, and library ÷ raw the median of each round's ratio
/// (its range beside it).
async fn concurrency_table(levels: &[usize], seconds: u64, rounds: usize) {
    println!(
        "| store | keys | workers | messages/s | store requests/s | claim p50 ms | claim p99 ms | raw messages/s | library ÷ raw (range) | raw claim p99 ms | tool | tool rate/s | library ÷ tool | tool p99 ms | in progress | errors |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut cpu_rows = Vec::new();
    let only = std::env::var("SCALE_STORES").unwrap_or_default();
    for kind in [Store::Redis, Store::RedisCluster, Store::Postgres] {
        let wanted = match kind {
            Store::Redis => "redis",
            Store::RedisCluster => "redis-cluster",
            Store::Postgres => "postgres",
        };
        if !only.is_empty() && !only.split(',').any(|s| s == wanted) {
            continue;
        }
        let scope = match kind {
            Store::Postgres => "bench_scale.records".to_owned(),
            _ => format!("bench-scale:{}:", now_ms()),
        };
        if kind == Store::Postgres {
            prepare_postgres(&["bench_scale.records", RAW_TABLE]).await;
        }
        for hot in [false, true] {
            let keys = if hot { "one hot key" } else { "distinct" };
            'level: for &workers in levels {
                let (mut library, mut raws, mut tools) = (Vec::new(), Vec::new(), Vec::new());
                for _ in 0..rounds {
                    match run_level(kind, &scope, workers, seconds, hot).await {
                        Ok(sample) => library.push(sample),
                        Err(e) => {
                            println!(
                                "| {} | {keys} | {workers} | refused: {e} | | | | | | | | | | | | |",
                                kind.name()
                            );
                            continue 'level;
                        }
                    }
                    raws.push(raw(kind, workers, seconds, hot).await);
                    tools.extend(tool(kind, workers, seconds, hot).await);
                }
                let rate = |s: &[Sample]| {
                    (!s.is_empty()).then(|| median(s.iter().map(|x| x.rate).collect()))
                };
                let lib_rate = rate(&library).unwrap_or(0.0);
                let ratios: Vec<f64> = library
                    .iter()
                    .zip(&raws)
                    .filter_map(|(l, r)| Some((l, r.as_ref()?)))
                    .map(|(l, r)| l.rate / r.rate)
                    .collect();
                let raws: Vec<Sample> = raws.into_iter().flatten().collect();
                let ratio = if ratios.is_empty() {
                    "-".to_owned()
                } else {
                    let (lo, hi) = ratios
                        .iter()
                        .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
                    format!("{:.2} ({lo:.2}–{hi:.2})", median(ratios.clone()))
                };
                // A redis-benchmark call is one claim: comparable with a message only when
                // a message is one claim (the hot key).
                let tool_ratio = match (kind, rate(&tools)) {
                    (Store::Redis, _) if !hot => None,
                    (_, Some(t)) => Some(lib_rate / t),
                    _ => None,
                };
                let mut claims: Vec<Duration> = library
                    .iter()
                    .flat_map(|s| s.claims.iter().copied())
                    .collect();
                claims.sort_unstable();
                let mut raw_claims: Vec<Duration> =
                    raws.iter().flat_map(|s| s.claims.iter().copied()).collect();
                raw_claims.sort_unstable();
                let raw_p99 =
                    (!raw_claims.is_empty()).then(|| pick(&raw_claims, 0.99).as_secs_f64() * 1e3);
                let tool_p99 = (!tools.is_empty())
                    .then(|| median(tools.iter().filter_map(Sample::p99_ms).collect()));
                let per_message = if hot { 1.0 } else { 2.0 };
                println!(
                    "| {} | {keys} | {workers} | {lib_rate:.0} | {:.0} | {} | {} | {} | {ratio} | {} | {} | {} | {} | {} | {} | {} |",
                    kind.name(),
                    lib_rate * per_message,
                    ms(pick(&claims, 0.5)),
                    ms(pick(&claims, 0.99)),
                    num(rate(&raws), 0),
                    num(raw_p99, 2),
                    tool_name(kind),
                    num(rate(&tools), 0),
                    num(tool_ratio, 2),
                    num(tool_p99, 2),
                    library.iter().map(|s| s.in_progress).sum::<u64>(),
                    library.iter().map(|s| s.errors).sum::<u64>(),
                );
                let cpu = |s: &[Sample], f: fn(&Sample) -> Option<f64>| {
                    let values: Vec<f64> = s.iter().filter_map(f).collect();
                    num((!values.is_empty()).then(|| median(values)), 1)
                };
                cpu_rows.push(format!(
                    "| {} | {keys} | {workers} | {} | {} | {} | {} | {} | {} |",
                    kind.name(),
                    cpu(&library, |s| Some(s.client_us)),
                    cpu(&raws, |s| Some(s.client_us)),
                    cpu(&tools, |s| Some(s.client_us)),
                    cpu(&library, |s| s.server_us),
                    cpu(&raws, |s| s.server_us),
                    cpu(&tools, |s| s.server_us),
                ));
            }
        }
    }
    println!(
        "\nCPU per message, µs (medians over the rounds; client: this process, or the tool's):\n"
    );
    println!(
        "| store | keys | workers | client, library | client, raw | client, tool | Redis server, library | Redis server, raw | Redis server, tool |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for row in cpu_rows {
        println!("{row}");
    }
}

async fn prepare_postgres(tables: &[&str]) {
    let (client, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
        .await
        .expect("PostgreSQL");
    tokio::spawn(connection);
    client
        .batch_execute("CREATE SCHEMA IF NOT EXISTS bench_scale")
        .await
        .unwrap();
    for table in tables {
        client
            .batch_execute(&format!("DROP TABLE IF EXISTS {table}"))
            .await
            .unwrap();
        let store = PostgresStore::from_url(&postgres_url(), *table).unwrap();
        store.create_table().await.unwrap();
    }
}

#[tokio::main]
async fn main() {
    let levels = env_list("SCALE_LEVELS", &[1, 4, 16, 64, 256]);
    let seconds = env_num("SCALE_SECONDS", 2);
    let rounds = env_num("SCALE_ROUNDS", 5).max(1) as usize;
    let records = env_num("SCALE_RECORDS", 1_000_000);
    println!(
        "== concurrency: {rounds} rounds of {seconds} s per level and variant, each worker with its own connection"
    );
    concurrency_table(&levels, seconds, rounds).await;
    if records > 0 {
        println!("\n== volume: {records} records");
        volume::table(records).await;
    }
    // The records of every variant, gone: millions of keys that live for days would slow
    // every later listing of the Redis the tests share.
    let patterns = [
        "bench-scale:*",
        "bench-raw:*",
        "bench-raw-msg:*",
        "bench-volume:*",
    ];
    let mut nodes = vec![redis_url()];
    if let Ok(cluster) = std::env::var("REDIS_CLUSTER_TEST_URLS") {
        nodes.extend(cluster.split(',').map(str::to_owned));
    }
    for node in nodes {
        match benchmarks::purge_redis(&node, &patterns).await {
            Ok(n) => eprintln!("deleted {n} benchmark keys on {node}"),
            Err(e) => eprintln!("could not delete the benchmark keys on {node}: {e}"),
        }
    }
}

mod volume {
    //! A million records: claim latency against the table's size, PostgreSQL's purge, and
    //! Redis memory per record.
    use super::*;

    /// p50 and p99 of `n` claims with completions on fresh keys, one connection.
    async fn claim_latency(store: Arc<dyn IdempotencyStore>, n: usize) -> (Duration, Duration) {
        let timed = Timed::new(store);
        let idempotency = Idempotency::builder(timed.clone())
            .function_name("bench")
            .build();
        let op = Operation::new("volume", KeyStrategy::field("id"));
        let run = now_ms();
        // A warm-up first: the connection, its prepared statements, the server's caches.
        for i in 0..500 {
            let _ = idempotency
                .execute(&op, &json!({"id": format!("warm-{run}-{i}")}), || async {
                    Ok::<_, String>(1u8)
                })
                .await;
        }
        timed.claims();
        for i in 0..n {
            let _ = idempotency
                .execute(&op, &json!({"id": format!("probe-{run}-{i}")}), || async {
                    Ok::<_, String>(1u8)
                })
                .await;
        }
        let mut claims = timed.claims();
        claims.sort_unstable();
        (claims[claims.len() / 2], claims[claims.len() * 99 / 100])
    }

    async fn redis(records: u64) {
        let ns = format!("bench-volume:{}:", now_ms());
        let store = RedisStore::connect(&redis_url())
            .await
            .expect("Redis")
            .namespace(ns.clone());
        let memory = |s: &RedisStore| {
            let s = s.clone();
            async move {
                let info = s.query(redis::cmd("INFO").arg("memory")).await.unwrap();
                let redis::Value::BulkString(text) = info else {
                    return 0u64;
                };
                String::from_utf8_lossy(&text)
                    .lines()
                    .find_map(|l| l.strip_prefix("used_memory:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0)
            }
        };
        let empty = claim_latency(Arc::new(store.clone()), 5_000).await;
        let before = memory(&store).await;
        // A completed record as the store writes it, a million times, by a server-side loop
        // in chunks of 100 000 (each well within the store's request timeout).
        let now = now_ms();
        let started = Instant::now();
        let chunk = 100_000u64;
        let mut first = 1u64;
        while first <= records {
            let last = (first + chunk - 1).min(records);
            let fill = format!(
                "for i = {first}, {last} do \
                   local k = '{ns}fill-' .. i \
                   redis.call('HSET', k, 'status', 'COMPLETED', 'expiration', '{exp}', 'data', '{{\"ok\":1}}', 'lease_token', '0123456789abcdef0123456789abcdef01234567', 'validation', '') \
                   redis.call('PEXPIREAT', k, {pexp}) \
                 end return {last}",
                exp = now / 1000 + 86_400,
                pexp = now + 86_400_000,
            );
            store
                .query(redis::cmd("EVAL").arg(fill).arg(0))
                .await
                .expect("fill");
            first = last + 1;
        }
        let filled_in = started.elapsed();
        let after = memory(&store).await;
        let full = claim_latency(Arc::new(store.clone()), 5_000).await;
        println!(
            "| Redis | {records} | {:.1} s (server-side loop) | {} / {} | {} / {} | {} bytes per record |",
            filled_in.as_secs_f64(),
            ms(empty.0),
            ms(empty.1),
            ms(full.0),
            ms(full.1),
            (after.saturating_sub(before)) / records
        );
        // Leave nothing behind: the records expire in a day anyway; delete them now.
        let mut first = 1u64;
        while first <= records {
            let last = (first + 100_000 - 1).min(records);
            let clear = format!(
                "for i = {first}, {last} do redis.call('UNLINK', '{ns}fill-' .. i) end return 1"
            );
            let _ = store.query(redis::cmd("EVAL").arg(clear).arg(0)).await;
            first = last + 1;
        }
    }

    async fn postgres(records: u64) {
        let table = "bench_scale.volume";
        prepare_postgres(&[table]).await;
        let store = PostgresStore::from_url(&postgres_url(), table).unwrap();
        store.ensure_connected().await.unwrap();
        let (client, connection) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        let empty = claim_latency(Arc::new(store.clone()), 5_000).await;
        // Completed records that expired an hour ago: what `purge_expired` deletes.
        let now = now_ms() as i64;
        let started = Instant::now();
        client
            .batch_execute(&format!(
                "INSERT INTO {table} (id, status, expiration, in_progress_expiration, data, validation, lease_token) \
                 SELECT 'fill-' || i, 'COMPLETED', {exp}, NULL, '{{\"ok\":1}}', NULL, '0123456789abcdef0123456789abcdef01234567' \
                 FROM generate_series(1, {records}) AS i; ANALYZE {table}",
                exp = now / 1000 - 3600,
            ))
            .await
            .expect("fill");
        let filled_in = started.elapsed();
        let (full_size, full_index) = size(&client, table).await;
        let full = claim_latency(Arc::new(store.clone()), 5_000).await;
        let started = Instant::now();
        let mut purged = 0u64;
        loop {
            let n = store.purge_expired(10_000).await.expect("purge");
            purged += n;
            if n < 10_000 {
                break;
            }
        }
        let purge_time = started.elapsed();
        let dead: i64 = client
            .query_one(
                "SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = 'bench_scale' AND relname = 'volume'",
                &[],
            )
            .await
            .map(|r| r.get(0))
            .unwrap_or(-1);
        let (after_size, after_index) = size(&client, table).await;
        client
            .batch_execute(&format!("VACUUM {table}"))
            .await
            .unwrap();
        let (vacuumed, vacuumed_index) = size(&client, table).await;
        println!(
            "| PostgreSQL | {records} | {:.1} s (one INSERT ... SELECT) | {} / {} | {} / {} | table {} MB (indexes {} MB); purge_expired(10000) deleted {purged} rows in {:.1} s ({:.0} rows/s); after: {} MB ({} MB), {dead} dead rows; after VACUUM: {} MB ({} MB) |",
            filled_in.as_secs_f64(),
            ms(empty.0),
            ms(empty.1),
            ms(full.0),
            ms(full.1),
            full_size / 1_048_576,
            full_index / 1_048_576,
            purge_time.as_secs_f64(),
            purged as f64 / purge_time.as_secs_f64(),
            after_size / 1_048_576,
            after_index / 1_048_576,
            vacuumed / 1_048_576,
            vacuumed_index / 1_048_576,
        );
        client
            .batch_execute(&format!("DROP TABLE IF EXISTS {table}"))
            .await
            .unwrap();
    }

    /// The table's total size and its indexes' size, in bytes.
    async fn size(client: &tokio_postgres::Client, table: &str) -> (i64, i64) {
        let row = client
            .query_one(
                &format!("SELECT pg_total_relation_size('{table}'), pg_indexes_size('{table}')"),
                &[],
            )
            .await
            .unwrap();
        (row.get::<_, i64>(0), row.get::<_, i64>(1))
    }

    pub(super) async fn table(records: u64) {
        println!(
            "| store | records | filled in | claim p50 / p99 ms, before | claim p50 / p99 ms, after | size |"
        );
        println!("|---|---|---|---|---|---|");
        redis(records).await;
        postgres(records).await;
    }
}
