//! Runs the stand-in provider as a process, for driving the real worker binary.
//!
//! `provider-stub [--port N] [--port-file F] [--log-file L] [--delay-ms MS]`
//! Each request is appended to the log file as one JSON line.

use provider_stub::ProviderStub;
use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut port = 0u16;
    let mut port_file = None;
    let mut log_file = None;
    let mut delay_ms = 0u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{arg} needs a value")))
        };
        match arg.as_str() {
            "--port" => {
                port = value()
                    .parse()
                    .unwrap_or_else(|_| usage("--port takes a number"))
            }
            "--port-file" => port_file = Some(value()),
            "--log-file" => log_file = Some(value().into()),
            "--delay-ms" => {
                delay_ms = value()
                    .parse()
                    .unwrap_or_else(|_| usage("--delay-ms takes a number"))
            }
            other => usage(&format!("unknown argument {other}")),
        }
    }
    let stub = ProviderStub::start_on(&format!("127.0.0.1:{port}"), log_file)
        .await
        .unwrap_or_else(|e| usage(&format!("cannot listen on port {port}: {e}")));
    stub.set_delay(Duration::from_millis(delay_ms));
    let base = stub.base_url();
    if let Some(file) = port_file {
        let port = base.rsplit(':').next().unwrap_or_default();
        std::fs::write(&file, port).unwrap_or_else(|e| usage(&format!("cannot write {file}: {e}")));
    }
    println!("provider stub listening on {base}");
    std::future::pending::<()>().await;
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "provider-stub: {problem}\nusage: provider-stub [--port N] [--port-file F] [--log-file L] [--delay-ms MS]"
    );
    std::process::exit(2)
}
