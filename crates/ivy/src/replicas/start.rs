//! Building the pool at start: every endpoint found (names resolved once, then watched), and
//! every endpoint answering before the gateway serves.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::discovery::{self, Resolve, Target};
use super::{Pool, Watch};
use crate::config::IvyArgs;
use crate::error::IvyError;
use crate::gateway::Tulips;

/// Between two "still waiting" log lines.
const WAIT_LOG_EVERY: Duration = Duration::from_secs(10);

/// The pool of `tulips`, once each endpoint has a replica that answered (logging while it
/// waits, failing after `patience`), with its health checks and name watches running.
pub async fn start(
    args: &IvyArgs,
    tulips: Tulips,
    resolver: Arc<dyn Resolve>,
    patience: Duration,
) -> Result<Arc<Pool>, IvyError> {
    let watch = Watch {
        interval: args.health_interval,
        timeout: args.health_timeout,
    };
    let pool = Pool::new(watch, args.keys.clone());
    let mut origins = Vec::new();
    match tulips {
        Tulips::InProcess(client) => {
            pool.add("in-process".into(), "in-process", client);
            origins.push("in-process".to_string());
        }
        Tulips::Endpoints(endpoints) if endpoints.is_empty() => {
            return Err(IvyError::Unavailable("no Tulip endpoint given".into()))
        }
        Tulips::Endpoints(endpoints) => {
            for endpoint in endpoints {
                add_endpoint(&pool, &endpoint, &resolver, args.discovery_interval).await?;
                origins.push(endpoint);
            }
        }
    }
    wait_for(&pool, &origins, patience).await?;
    tokio::spawn(pool.clone().watch());
    Ok(pool)
}

/// Adds one `--tulip-endpoint`: its address, or what its name resolves to now (and from then on).
async fn add_endpoint(
    pool: &Arc<Pool>,
    endpoint: &str,
    resolver: &Arc<dyn Resolve>,
    every: Duration,
) -> Result<(), IvyError> {
    match Target::parse(endpoint)? {
        Target::Fixed(url) => {
            let client = pool.client(&url)?;
            pool.add(url, endpoint, client);
        }
        Target::Name { scheme, host, port } => {
            let urls = discovery::resolve(resolver.as_ref(), &scheme, &host, port).await?;
            tracing::info!("{endpoint} resolves to {}", urls.join(", "));
            pool.sync(endpoint, &urls);
            let (pool, origin) = (pool.clone(), endpoint.to_string());
            let apply = move |urls: Vec<String>| pool.sync(&origin, &urls);
            let name = (scheme, host, port);
            tokio::spawn(discovery::watch(resolver.clone(), name, every, apply));
        }
    }
    Ok(())
}

/// Returns once every origin has a replica that answered; fails on a refused replica (two
/// models under one name) or after `patience`.
async fn wait_for(pool: &Pool, origins: &[String], patience: Duration) -> Result<(), IvyError> {
    let start = Instant::now();
    let mut next_log = start + WAIT_LOG_EVERY;
    loop {
        pool.check_all().await;
        let members = pool.members();
        if let Some(why) = members.iter().find_map(|r| r.refusal()) {
            return Err(IvyError::Unavailable(why.to_string()));
        }
        let waiting: Vec<&str> = (origins.iter())
            .filter(|o| {
                !members
                    .iter()
                    .any(|r| &r.origin == *o && r.info().is_some())
            })
            .map(String::as_str)
            .collect();
        if waiting.is_empty() {
            return Ok(());
        }
        let waited = start.elapsed();
        if waited > patience {
            return Err(IvyError::Unavailable(format!(
                "Tulip at {} did not answer within {patience:?}",
                waiting.join(", ")
            )));
        }
        if Instant::now() >= next_log {
            tracing::info!(
                "waiting for Tulip at {} ({}s so far)",
                waiting.join(", "),
                waited.as_secs()
            );
            next_log += WAIT_LOG_EVERY;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::net::SocketAddr;
    use std::sync::Mutex;

    use tulip::ApiKeys;

    use futures::future::BoxFuture;

    use super::*;

    /// Answers whatever the test last put in it.
    struct Scripted(Mutex<io::Result<Vec<SocketAddr>>>);

    impl Scripted {
        fn answer(&self, ips: &[&str]) {
            let addrs = ips.iter().map(|ip| format!("{ip}:7000").parse().unwrap());
            *self.0.lock().unwrap() = Ok(addrs.collect());
        }
    }

    impl Resolve for Scripted {
        fn resolve<'a>(&'a self, _: &'a str, _: u16) -> BoxFuture<'a, io::Result<Vec<SocketAddr>>> {
            let answer = match &*self.0.lock().unwrap() {
                Ok(addrs) => Ok(addrs.clone()),
                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
            };
            Box::pin(async move { answer })
        }
    }

    fn urls(pool: &Pool) -> Vec<String> {
        pool.members().iter().map(|r| r.url.clone()).collect()
    }

    #[tokio::test]
    async fn a_watched_name_adds_and_removes_replicas_live() {
        let scripted = Arc::new(Scripted(Mutex::new(Ok(vec![]))));
        scripted.answer(&["127.0.0.2", "127.0.0.3"]);
        let resolver: Arc<dyn Resolve> = scripted.clone();
        let pool = Pool::new(
            Watch {
                interval: Duration::from_secs(1),
                timeout: Duration::from_secs(1),
            },
            ApiKeys::default(),
        );
        let every = Duration::from_millis(10);
        add_endpoint(&pool, "http://tulip.svc:7000", &resolver, every)
            .await
            .unwrap();
        assert_eq!(
            urls(&pool),
            ["http://127.0.0.2:7000", "http://127.0.0.3:7000"]
        );

        scripted.answer(&["127.0.0.3", "127.0.0.4"]);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            urls(&pool),
            ["http://127.0.0.3:7000", "http://127.0.0.4:7000"]
        );

        // A failed lookup keeps the replicas; the next answer applies again.
        *scripted.0.lock().unwrap() = Err(io::Error::other("SERVFAIL"));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(urls(&pool).len(), 2);
        scripted.answer(&["127.0.0.4"]);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(urls(&pool), ["http://127.0.0.4:7000"]);
    }

    #[tokio::test]
    async fn an_unresolvable_name_fails_at_start_naming_it() {
        let scripted = Arc::new(Scripted(Mutex::new(Err(io::Error::other("NXDOMAIN")))));
        let resolver: Arc<dyn Resolve> = scripted;
        let args = IvyArgs {
            tulip_endpoints: vec!["http://nowhere.svc:7000".into()],
            ..IvyArgs::default()
        };
        let tulips = Tulips::Endpoints(args.tulip_endpoints.clone());
        let err = start(&args, tulips, resolver, Duration::from_secs(1))
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("nowhere.svc") && err.contains("NXDOMAIN"),
            "{err}"
        );
    }
}
