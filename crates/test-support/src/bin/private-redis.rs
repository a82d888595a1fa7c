//! `private-redis --dir DIR --port-file FILE [-- ARGS...]`: becomes a private
//! `redis-server` (the command line of [`test_support::redis_server::command`]) on a free
//! port, in `DIR/redis-PORT`, logging to `log` there, with `ARGS` added (cluster mode,
//! say). Writes the port to `FILE` first. The process is the server (`exec`), so the
//! caller stops it by this process's id. `scripts/lib/servers.sh` starts its private
//! servers with it.

use std::os::unix::process::CommandExt;
use test_support::redis_server::{command, free_port};

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut dir, mut port_file) = (None, None);
    let mut extra = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--dir" => dir = args.next(),
            "--port-file" => port_file = args.next(),
            "--" => extra.extend(args.by_ref()),
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    let (Some(dir), Some(port_file)) = (dir, port_file) else {
        usage("--dir and --port-file are required");
    };
    let port = free_port();
    let dir = std::path::Path::new(&dir).join(format!("redis-{port}"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| fail(&format!("{}: {e}", dir.display())));
    let log = std::fs::File::create(dir.join("log")).unwrap_or_else(|e| fail(&e.to_string()));
    let log2 = log.try_clone().unwrap_or_else(|e| fail(&e.to_string()));
    // Written whole, then renamed: a reader never sees half a port.
    let partial = format!("{port_file}.partial");
    std::fs::write(&partial, port.to_string())
        .and_then(|()| std::fs::rename(&partial, &port_file))
        .unwrap_or_else(|e| fail(&format!("{port_file}: {e}")));
    let err = command(&dir)
        .args(["--port", &port.to_string()])
        .args(extra)
        .stdout(log)
        .stderr(log2)
        .exec();
    fail(&format!(
        "cannot run redis-server: {err} (install Redis 7: apt-get install redis-server, brew install redis)"
    ));
}

fn usage(problem: &str) -> ! {
    fail(&format!(
        "{problem}\nusage: private-redis --dir DIR --port-file FILE [-- REDIS-SERVER-ARGS...]"
    ))
}

fn fail(message: &str) -> ! {
    eprintln!("private-redis: {message}");
    std::process::exit(1)
}
