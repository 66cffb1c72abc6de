//! `ivy-serve` and `tulip-serve`: parse flags, load ROSE under Tulip, serve until a signal.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser};
use ivy::{EarlyTokenizer, IvyArgs, Tulips};
use pyo3::prelude::*;
use tokio::sync::watch;
use tulip::config::heading;
use tulip::{ApiKeys, Scheduler, TulipArgs, TulipClient};

use crate::engine::{EngineArgs, Rose};
use crate::telemetry::{Logs, Telemetry};
use crate::workers::{self, WorkerArgs};

/// Ivy, Tulip and ROSE in one process: an OpenAI- and TEI-compatible embedding server.
#[derive(Debug, Parser)]
#[command(name = "ivy-serve", version)]
struct IvyServe {
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    ivy: IvyArgs,
    #[command(flatten)]
    tulip: TulipArgs,
    #[command(flatten)]
    workers: WorkerArgs,
    #[command(flatten)]
    logs: Logs,
}

/// Tulip and ROSE alone: the gRPC inference server that `ivy-serve --tulip-endpoint` uses.
#[derive(Debug, Parser)]
#[command(name = "tulip-serve", version)]
struct TulipServe {
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    tulip: TulipArgs,
    #[command(flatten)]
    listen: Listen,
    #[command(flatten)]
    logs: Logs,
}

#[derive(Debug, Args)]
struct Listen {
    /// Address to listen on (0.0.0.0 for every interface).
    #[arg(long, env = "IVY_HOSTNAME", default_value = "0.0.0.0", help_heading = heading::SERVING)]
    hostname: String,

    /// Serve Prometheus metrics (steps, batch sizes, queue: what ivy-serve's /metrics has of its
    /// in-process Tulip) over HTTP at /metrics on this port of --hostname. Off unless given.
    #[arg(long, env = "METRICS_PORT", help_heading = heading::SERVING)]
    metrics_port: Option<u16>,
}

/// `ivy-serve`: Ivy, Tulip and ROSE in one process (or Ivy alone over `--tulip-endpoint`);
/// returns the exit code.
#[pyfunction]
pub fn serve_ivy(py: Python<'_>, argv: Vec<String>) -> i32 {
    match IvyServe::try_parse_from(&argv) {
        Ok(a) if workers::wanted(&a.engine.model, &a.workers) => serve_workers(py, a, &argv),
        Ok(a) => {
            // Ivy's own /metrics has its in-process Tulip's.
            let listen = Listen {
                hostname: a.ivy.hostname.clone(),
                metrics_port: None,
            };
            serve(
                py,
                a.engine,
                a.tulip,
                Some(a.ivy),
                listen,
                &a.logs,
                "ivy-serve",
            )
        }
        Err(err) => usage(err),
    }
}

/// `tulip-serve`: Tulip and ROSE alone, for gateways elsewhere; returns the exit code.
#[pyfunction]
pub fn serve_tulip(py: Python<'_>, argv: Vec<String>) -> i32 {
    match TulipServe::try_parse_from(&argv) {
        Ok(a) if a.engine.model.len() > 1 => {
            eprintln!("tulip-serve serves one --model (ivy-serve takes several)");
            2
        }
        Ok(a) => serve(
            py,
            a.engine,
            a.tulip,
            None,
            a.listen,
            &a.logs,
            "tulip-serve",
        ),
        Err(err) => usage(err),
    }
}

/// Prints clap's message (help, version, or what is wrong); its exit code.
fn usage(err: clap::Error) -> i32 {
    let _ = err.print();
    err.exit_code()
}

fn serve(
    py: Python<'_>,
    mut engine: EngineArgs,
    tulip: TulipArgs,
    mut ivy: Option<IvyArgs>,
    listen: Listen,
    logs: &Logs,
    command: &str,
) -> i32 {
    let (runtime, telemetry) = match start_runtime(logs, command) {
        Ok(started) => started,
        Err(why) => {
            eprintln!("{why}");
            return 2;
        }
    };
    let python_logs = py
        .import("tulip.serve")
        .and_then(|m| m.call_method1("configure_logging", (logs.json_output,)));
    if let Err(err) = python_logs {
        tracing::warn!("cannot configure Python's logging: {err}");
    }
    let local = ivy
        .as_ref()
        .is_none_or(|ivy| ivy.tulip_endpoints.is_empty());
    let mut tokenizer = None;
    if local {
        // A hub id is fetched (or found in the cache) once, here; everything after reads the folder.
        match model_root(py, &engine) {
            Ok(root) => {
                tokenizer = Some(root.join("tokenizer.json"));
                if !engine.model.is_empty() {
                    engine.model = vec![root.display().to_string()];
                }
            }
            Err(why) => {
                tracing::error!("{why}");
                return 1;
            }
        }
    }
    if let Some(ivy) = ivy.as_mut() {
        ivy.otlp_endpoint = logs.otlp_endpoint.clone();
    }
    // Everything below runs without the GIL: the engine thread takes it when it calls ROSE.
    let result = py.detach(|| run(&runtime, engine, tulip, ivy, listen, tokenizer));
    telemetry.shutdown();
    match result {
        Ok(()) => 0,
        Err(err) => {
            tracing::error!("{err}");
            1
        }
    }
}

/// The model folder that ROSE will load (rose.loading.model_dir.model_root): the --model folder,
/// a hub id's snapshot in huggingface_hub's cache, or the default model's.
pub(crate) fn model_root(py: Python<'_>, engine: &EngineArgs) -> Result<PathBuf, String> {
    py.import("rose.loading.model_dir")
        .and_then(|m| m.call_method1("model_root", (engine.single_model(), &engine.revision)))
        .and_then(|root| root.extract::<PathBuf>())
        .map_err(|e| e.value(py).to_string())
}

fn run(
    runtime: &tokio::runtime::Runtime,
    engine: EngineArgs,
    tulip: TulipArgs,
    mut ivy: Option<IvyArgs>,
    listen: Listen,
    tokenizer: Option<PathBuf>,
) -> Result<(), String> {
    let hostname = listen.hostname;
    let keys = ApiKeys::load(&tulip.auth)?;
    if let Some(ivy) = ivy.as_mut() {
        ivy.keys = keys.clone();
    }
    runtime.block_on(async move {
        let stopped = stop_on_signal(watch::channel(false));
        let until = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };

        if let Some(ivy) = ivy.as_ref().filter(|ivy| !ivy.tulip_endpoints.is_empty()) {
            let tulips = Tulips::Endpoints(ivy.tulip_endpoints.clone());
            return ivy::run(ivy.clone(), tulips, None, None, until(stopped))
                .await
                .map_err(|e| e.to_string());
        }

        let grpc_port = tulip.grpc_port;
        let ip: IpAddr = tokio::net::lookup_host((hostname.as_str(), 0))
            .await
            .ok()
            .and_then(|mut addrs| addrs.next())
            .map(|a| a.ip())
            .ok_or_else(|| format!("cannot resolve --hostname {hostname}"))?;
        let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, grpc_port))
            .await
            .map_err(|e| format!("cannot listen on {ip}:{grpc_port}: {e}"))?;
        if let Some(port) = listen.metrics_port {
            let metrics = tokio::net::TcpListener::bind(SocketAddr::new(ip, port))
                .await
                .map_err(|e| format!("cannot listen on {ip}:{port}: {e}"))?;
            tracing::info!("Tulip serves its metrics at http://{ip}:{port}/metrics");
            tokio::spawn(ivy::metrics::serve_alone(metrics, until(stopped.clone())));
        }
        // Steps are recorded from the first: a supervising gateway (the Metrics RPC) or
        // --metrics-port reads them.
        tulip::metrics::install();
        // Ivy's tokenizer is parsed while the engine loads.
        let early = tokenizer.map(EarlyTokenizer::start);
        let scheduler = start_engine(engine, tulip).await?;
        tokio::spawn(exit_when_broken(scheduler.clone()));
        let grpc_addr = listener.local_addr().map_err(|e| e.to_string())?;
        tracing::info!("Tulip listens for gRPC on {grpc_addr}");
        // Other gateways and tulip.Client reach Tulip over gRPC; this process's Ivy calls it
        // directly, which saves the loopback round trip on every request.
        let local = TulipClient::in_process(scheduler.clone());
        let grpc = tokio::spawn(tulip::server::serve(
            scheduler,
            listener,
            keys,
            until(stopped.clone()),
        ));

        if let Some(ivy) = ivy {
            ivy::run(
                ivy,
                Tulips::InProcess(local),
                early,
                Some(grpc_addr.to_string()),
                until(stopped),
            )
            .await
            .map_err(|e| e.to_string())?;
        }
        grpc.await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("Tulip's gRPC server failed: {e}"))
    })
}

/// How long a process whose engine failed fatally keeps answering (the failed requests' errors,
/// /health's 503) before it exits.
const FATAL_GRACE: Duration = Duration::from_secs(2);

/// The exit status after a fatal engine fault (EX_SOFTWARE).
const EXIT_ENGINE_FATAL: i32 = 70;

/// A fatal engine fault (a sticky CUDA error) cannot be undone in this process: its health checks
/// fail at once, and after FATAL_GRACE it exits, so that its supervisor (Ivy for a worker,
/// Kubernetes or systemd for a server) starts a fresh one.
async fn exit_when_broken(scheduler: Scheduler) {
    while !scheduler.is_broken() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tracing::error!(
        "the engine stopped after a fatal fault; exiting in {FATAL_GRACE:?} with status \
         {EXIT_ENGINE_FATAL} so that a supervisor restarts the server"
    );
    tokio::time::sleep(FATAL_GRACE).await;
    std::process::exit(EXIT_ENGINE_FATAL);
}

/// `ivy-serve` over worker processes (several models, `--replicas`, `--devices`): Ivy in this
/// process, one supervised `tulip-serve` per worker on ports from `--grpc-port`.
fn serve_workers(py: Python<'_>, mut a: IvyServe, argv: &[String]) -> i32 {
    let (runtime, telemetry) = match start_runtime(&a.logs, "ivy-serve") {
        Ok(started) => started,
        Err(why) => {
            eprintln!("{why}");
            return 2;
        }
    };
    a.ivy.otlp_endpoint = a.logs.otlp_endpoint.clone();
    if !a.ivy.tulip_endpoints.is_empty() {
        tracing::error!("--tulip-endpoint and worker processes (--replicas, --devices, several --model) exclude each other");
        return 2;
    }
    let plan = match workers::plan(&a.engine.model, &a.workers, a.tulip.grpc_port) {
        Ok(plan) => plan,
        Err(why) => {
            tracing::error!("{why}");
            return 2;
        }
    };
    let python = match py
        .import("sys")
        .and_then(|sys| sys.getattr("executable")?.extract())
    {
        Ok(python) => python,
        Err(err) => {
            tracing::error!("cannot find the Python interpreter for the workers: {err}");
            return 1;
        }
    };
    let forwarded = workers::forwarded(argv, &IvyServe::command(), &TulipServe::command());
    let result = py.detach(|| run_workers(&runtime, a, plan, python, forwarded));
    telemetry.shutdown();
    match result {
        Ok(()) => 0,
        Err(err) => {
            tracing::error!("{err}");
            1
        }
    }
}

fn run_workers(
    runtime: &tokio::runtime::Runtime,
    mut a: IvyServe,
    plan: Vec<workers::Worker>,
    python: PathBuf,
    forwarded: Vec<String>,
) -> Result<(), String> {
    a.ivy.keys = ApiKeys::load(&a.tulip.auth)?;
    a.ivy.worker_metrics = true;
    runtime.block_on(async move {
        let stopped = stop_on_signal(watch::channel(false));
        // The workers stop after Ivy has drained: its admitted requests still need them.
        let (halt, halted) = watch::channel(false);
        let (fatal, mut fatal_rx) = tokio::sync::mpsc::unbounded_channel();
        let timeout = a.ivy.shutdown_timeout;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = workers::cpu_threads(&plan, cores);
        let mut supervisors = Vec::new();
        for worker in &plan {
            let launch = workers::Launch {
                python: python.clone(),
                argv: workers::argv(worker, &forwarded, &a.engine.device),
                threads,
                api_key: a.ivy.keys.outbound_key().map(str::to_string),
            };
            supervisors.push(tokio::spawn(workers::supervise(
                launch,
                worker.clone(),
                halted.clone(),
                fatal.clone(),
                timeout,
            )));
        }
        let tulips = Tulips::Endpoints(plan.iter().map(workers::Worker::url).collect());
        let mut shutdown = stopped.clone();
        let serving = ivy::run(a.ivy, tulips, None, None, async move {
            let _ = shutdown.wait_for(|s| *s).await;
        });
        let result = tokio::select! {
            served = serving => served.map_err(|e| e.to_string()),
            Some(why) = fatal_rx.recv() => Err(why),
        };
        let _ = halt.send(true);
        // Each supervisor stops its worker on the halt signal.
        for supervisor in supervisors {
            let _ = supervisor.await;
        }
        result
    })
}

/// The multi-threaded runtime a command serves on, and its logs and traces (whose exporter
/// runs on it).
fn start_runtime(
    logs: &Logs,
    command: &str,
) -> Result<(tokio::runtime::Runtime, Telemetry), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name(command)
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let telemetry = {
        let _inside = runtime.enter();
        Telemetry::init(logs, command)?
    };
    Ok((runtime, telemetry))
}

/// Sends `true` on the channel at SIGTERM or SIGINT; returns its receiver.
fn stop_on_signal(
    (stop, stopped): (watch::Sender<bool>, watch::Receiver<bool>),
) -> watch::Receiver<bool> {
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        let _ = stop.send(true);
    });
    stopped
}

/// Loads ROSE under a Tulip scheduler in this process (the model folder already resolved).
pub(crate) async fn start_engine(
    engine: EngineArgs,
    tulip: TulipArgs,
) -> Result<Scheduler, String> {
    tokio::task::spawn_blocking(move || Scheduler::start(move || Rose::load(&engine, &tulip)))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install a SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
