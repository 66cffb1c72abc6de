//! `ivy-serve --replicas N --devices ...` and several `--model`s: one `tulip-serve` worker process
//! per (model, device, replica), each with its own engine and CUDA context, restarted when it
//! exits. The plan and the workers' flags are pure logic; `supervise` is the process I/O.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use clap::{Args, Command};
use tokio::process::Child;
use tokio::sync::{mpsc, watch};
use tulip::config::heading;
use tulip::{ApiKeys, TulipClient};

/// Flags that spread `ivy-serve` over worker processes.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// Worker processes per device (each a Tulip with its own engine), supervised; 1 with no
    /// --devices keeps the engine in the ivy-serve process.
    #[arg(long, env = "REPLICAS", default_value_t = 1, help_heading = heading::SCALING)]
    pub replicas: usize,

    /// Devices to start workers on, comma-separated: GPU indices (0,1,...) or cpu.
    #[arg(long, env = "DEVICES", value_delimiter = ',', help_heading = heading::SCALING)]
    pub devices: Vec<String>,
}

/// One worker to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worker {
    /// The --model it serves (None: the default model).
    pub model: Option<String>,
    /// A GPU index, "cpu", or None to let the engine choose (--device as given).
    pub device: Option<String>,
    /// Its gRPC port on 127.0.0.1.
    pub port: u16,
}

impl Worker {
    /// Its address, for Ivy.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// How logs name it.
    pub fn name(&self) -> String {
        let model = self.model.as_deref().unwrap_or("default model");
        let device = self.device.as_deref().unwrap_or("auto");
        format!("worker :{} ({model}, device {device})", self.port)
    }
}

/// Whether the flags ask for worker processes instead of the in-process engine.
pub fn wanted(models: &[String], args: &WorkerArgs) -> bool {
    models.len() > 1 || args.replicas > 1 || !args.devices.is_empty()
}

/// The workers: for each model, each device, `replicas` of them, on consecutive ports from
/// `base_port`.
pub fn plan(models: &[String], args: &WorkerArgs, base_port: u16) -> Result<Vec<Worker>, String> {
    if args.replicas == 0 {
        return Err("--replicas must be at least 1".into());
    }
    let models: Vec<Option<String>> = if models.is_empty() {
        vec![None]
    } else {
        models.iter().cloned().map(Some).collect()
    };
    let devices: Vec<Option<String>> = if args.devices.is_empty() {
        vec![None]
    } else {
        args.devices
            .iter()
            .map(|d| device(d).map(Some))
            .collect::<Result<_, _>>()?
    };
    let mut workers = Vec::new();
    for model in &models {
        for device in &devices {
            for _ in 0..args.replicas {
                let port = u16::try_from(base_port as usize + workers.len())
                    .map_err(|_| format!("too many workers for ports from {base_port}"))?;
                workers.push(Worker {
                    model: model.clone(),
                    device: device.clone(),
                    port,
                });
            }
        }
    }
    Ok(workers)
}

/// A --devices entry: a GPU index or cpu.
fn device(entry: &str) -> Result<String, String> {
    let entry = entry.trim();
    if entry == "cpu" || entry.parse::<u32>().is_ok() {
        Ok(entry.to_string())
    } else {
        Err(format!("--devices takes GPU indices or cpu, not {entry:?}"))
    }
}

/// Flags each worker gets instead of the parent's (the keys by environment: an argument shows in
/// every process listing).
const OWN_FLAGS: [&str; 6] = [
    "model",
    "grpc-port",
    "hostname",
    "device",
    "api-key",
    "api-key-file",
];

/// The flags of `argv` (ivy-serve's, read by `parent`) that `worker` (tulip-serve) also takes,
/// less those every worker sets itself; environment variables reach workers by inheritance.
pub fn forwarded(argv: &[String], parent: &Command, worker: &Command) -> Vec<String> {
    let knows = |command: &Command, name: &str| {
        (command.get_arguments())
            .find(|a| {
                a.get_long() == Some(name) || a.get_all_aliases().is_some_and(|v| v.contains(&name))
            })
            .map(|a| a.get_action().takes_values())
    };
    let mut out = Vec::new();
    let mut args = argv.iter().skip(1);
    while let Some(arg) = args.next() {
        let Some(flag) = arg.strip_prefix("--") else {
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((name, _)) => (name, true),
            None => (flag, false),
        };
        let takes_value = knows(parent, name).unwrap_or(false);
        let value = (takes_value && !inline).then(|| args.next()).flatten();
        if knows(worker, name).is_some() && !OWN_FLAGS.contains(&name) {
            out.push(arg.clone());
            out.extend(value.cloned());
        }
    }
    out
}

/// The full argument list of one worker: the forwarded flags and its own.
pub fn argv(worker: &Worker, forwarded: &[String], device_flag: &str) -> Vec<String> {
    let mut argv = forwarded.to_vec();
    if let Some(model) = &worker.model {
        argv.extend(["--model".into(), model.clone()]);
    }
    let device = match worker.device.as_deref() {
        Some("cpu") => "cpu",
        // The worker sees only its GPU (CUDA_VISIBLE_DEVICES), as cuda.
        Some(_) => "cuda",
        None => device_flag,
    };
    argv.extend(["--device".into(), device.into()]);
    argv.extend(["--hostname".into(), "127.0.0.1".into()]);
    argv.extend(["--grpc-port".into(), worker.port.to_string()]);
    argv
}

/// How long to wait before restarting a worker that has failed `failures` times in a row.
pub fn backoff(failures: u32) -> Duration {
    Duration::from_millis(500u64 << failures.min(6)).min(Duration::from_secs(30))
}

/// A worker that ran this long before it exited counts as having started fine (its failure
/// count restarts).
const STABLE: Duration = Duration::from_secs(60);

/// The intra-op threads each CPU worker gets: the cores shared out among the CPU workers, so that
/// N workers do not each spin a thread per core (None when no worker runs on the CPU).
pub fn cpu_threads(workers: &[Worker], cores: usize) -> Option<usize> {
    let on_cpu = workers
        .iter()
        .filter(|w| w.device.as_deref() == Some("cpu"))
        .count();
    (on_cpu > 0).then(|| (cores / on_cpu).max(1))
}

/// How to start one worker process.
pub struct Launch {
    /// The Python interpreter that runs `-m tulip.serve`.
    pub python: PathBuf,
    /// Its flags ([`argv`]).
    pub argv: Vec<String>,
    /// Its intra-op threads on the CPU ([`cpu_threads`]).
    pub threads: Option<usize>,
    /// The key it accepts (Ivy's, which Ivy sends), through its environment.
    pub api_key: Option<String>,
}

/// Runs `worker` (`python -m tulip.serve ARGV`) until `stop`, restarting it whenever it exits.
/// A worker that exits before it first answered its health check is a configuration error: it
/// is reported on `fatal` and not restarted.
pub async fn supervise(
    launch: Launch,
    worker: Worker,
    mut stop: watch::Receiver<bool>,
    fatal: mpsc::UnboundedSender<String>,
    shutdown_timeout: Duration,
) {
    let mut failures = 0;
    let mut served = false;
    loop {
        let mut child = match spawn(&launch, &worker) {
            Ok(child) => child,
            Err(err) => {
                let _ = fatal.send(format!("cannot start {}: {err}", worker.name()));
                return;
            }
        };
        tracing::info!("{} started (pid {:?})", worker.name(), child.id());
        let started = Instant::now();
        let exited = loop {
            tokio::select! {
                status = child.wait() => break status,
                _ = first_health(&worker), if !served => served = true,
                _ = stopped(&mut stop) => {
                    return terminate(child, &worker, shutdown_timeout).await;
                }
            }
        };
        let status = exited.map_or_else(|e| e.to_string(), |s| s.to_string());
        if !served {
            let _ = fatal.send(format!(
                "{} exited at start ({status}); its log above says why",
                worker.name()
            ));
            return;
        }
        failures = if started.elapsed() > STABLE {
            0
        } else {
            failures + 1
        };
        let wait = backoff(failures);
        tracing::warn!(
            "{} exited ({status}); restarting in {wait:?}",
            worker.name()
        );
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stopped(&mut stop) => return,
        }
    }
}

async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Resolves once the worker's gRPC health check first answers SERVING.
async fn first_health(worker: &Worker) {
    let Ok(client) = TulipClient::new(&worker.url(), &ApiKeys::default()) else {
        return std::future::pending().await;
    };
    while !matches!(client.health().await, Ok(true)) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn spawn(launch: &Launch, worker: &Worker) -> std::io::Result<Child> {
    let mut command = tokio::process::Command::new(&launch.python);
    command
        .args(["-m", "tulip.serve"])
        .args(&launch.argv)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .env_remove("API_KEY")
        .env_remove("API_KEY_FILE");
    if let Some(key) = &launch.api_key {
        command.env("API_KEY", key);
    }
    let threads = launch.threads;
    match worker.device.as_deref() {
        Some("cpu") => {
            // torch sizes its intra-op pool by OMP_NUM_THREADS; a value the user set wins.
            if let (Some(n), None) = (threads, std::env::var_os("OMP_NUM_THREADS")) {
                command.env("OMP_NUM_THREADS", n.to_string());
            }
        }
        Some(gpu) => {
            command.env("CUDA_VISIBLE_DEVICES", gpu);
        }
        None => {}
    }
    // A worker must not outlive its supervisor, even one killed with SIGKILL.
    #[cfg(target_os = "linux")]
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.spawn()
}

/// SIGTERM (the worker drains), then SIGKILL after `timeout`.
async fn terminate(mut child: Child, worker: &Worker, timeout: Duration) {
    if let Some(pid) = child.id() {
        // SAFETY: signalling our own child by its pid.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    }
    if tokio::time::timeout(timeout, child.wait()).await.is_err() {
        tracing::warn!(
            "{} did not stop within {timeout:?}; killing it",
            worker.name()
        );
        let _ = child.kill().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    fn args(replicas: usize, devices: &[&str]) -> WorkerArgs {
        WorkerArgs {
            replicas,
            devices: devices.iter().map(|d| d.to_string()).collect(),
        }
    }

    #[test]
    fn plans_a_worker_per_model_device_and_replica() {
        let models = ["a".to_string(), "b".to_string()];
        let workers = plan(&models, &args(2, &["0", "1"]), 7000).unwrap();
        assert_eq!(workers.len(), 8);
        assert_eq!(workers[0].port, 7000);
        assert_eq!(workers[7].port, 7007);
        assert_eq!(workers[2].device.as_deref(), Some("1"));
        assert_eq!(workers[4].model.as_deref(), Some("b"));
        let default = plan(&[], &args(3, &[]), 7000).unwrap();
        assert!(default
            .iter()
            .all(|w| w.model.is_none() && w.device.is_none()));
        assert!(plan(&[], &args(0, &[]), 7000).is_err());
        assert!(plan(&[], &args(1, &["gpu0"]), 7000)
            .unwrap_err()
            .contains("gpu0"));
        assert!(!wanted(&models[..1], &args(1, &[])));
        assert!(wanted(&models, &args(1, &[])));
        assert!(wanted(&[], &args(1, &["cpu"])));
    }

    #[derive(Parser)]
    struct Parent {
        #[arg(long)]
        model: Vec<String>,
        #[arg(long)]
        port: Option<u16>,
        #[arg(long)]
        dtype: Option<String>,
        #[arg(long)]
        replicas: Option<usize>,
        #[arg(long)]
        json_output: bool,
    }

    #[derive(Parser)]
    struct Child {
        #[arg(long)]
        model: Option<String>,
        #[arg(long)]
        dtype: Option<String>,
        #[arg(long)]
        json_output: bool,
    }

    #[test]
    fn workers_get_the_flags_they_take_less_their_own() {
        let argv: Vec<String> = [
            "ivy-serve",
            "--model",
            "a",
            "--port",
            "80",
            "--dtype=float32",
            "--replicas",
            "2",
            "--json-output",
            "--model",
            "b",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let out = forwarded(&argv, &Parent::command(), &Child::command());
        assert_eq!(out, ["--dtype=float32", "--json-output"]);
        let worker = Worker {
            model: Some("b".into()),
            device: Some("1".into()),
            port: 7001,
        };
        let full = super::argv(&worker, &out, "auto");
        assert_eq!(
            full[2..],
            [
                "--model",
                "b",
                "--device",
                "cuda",
                "--hostname",
                "127.0.0.1",
                "--grpc-port",
                "7001"
            ]
        );
    }

    #[test]
    fn cpu_workers_share_the_cores() {
        let cpu = plan(&[], &args(4, &["cpu"]), 7000).unwrap();
        assert_eq!(cpu_threads(&cpu, 16), Some(4));
        assert_eq!(cpu_threads(&cpu, 2), Some(1));
        let gpu = plan(&[], &args(2, &["0"]), 7000).unwrap();
        assert_eq!(cpu_threads(&gpu, 16), None);
    }

    #[test]
    fn backoff_grows_then_caps() {
        assert_eq!(backoff(0), Duration::from_millis(500));
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(20), Duration::from_secs(30));
    }
}
