//! Every Tulip replica the gateway knows, whatever model it serves: its state and load, and the
//! task that keeps the states true (health checks every interval, and the failures the fan-out
//! reports between them).

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use serde::Serialize;
use tulip::proto::ModelInfo;
use tulip::{ApiKeys, TulipClient, TulipError};

use super::balance;
use super::identity::differs;

/// How the pool watches its replicas.
#[derive(Debug, Clone, Copy)]
pub struct Watch {
    /// Between two health checks of a replica.
    pub interval: Duration,
    /// A health check (or the Info that follows a replica's first one) not answered in this long
    /// counts as a failure: a hung replica stops getting chunks.
    pub timeout: Duration,
}

/// Where a replica stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Not answered yet.
    Starting,
    /// Healthy: takes chunks.
    Ready,
    /// Failed its last health check or call; checked again every interval.
    Down,
    /// Serves a model under a name another replica serves differently; never used.
    Refused,
}

impl State {
    fn from_u8(v: u8) -> State {
        match v {
            1 => State::Ready,
            2 => State::Down,
            3 => State::Refused,
            _ => State::Starting,
        }
    }
}

/// One Tulip server.
pub struct Replica {
    /// Where it is (`in-process` for the Tulip inside `ivy-serve`).
    pub url: String,
    /// The `--tulip-endpoint` that named it.
    pub origin: String,
    pub(super) client: TulipClient,
    info: OnceLock<ModelInfo>,
    /// Why it is refused, if it is.
    refusal: OnceLock<String>,
    state: AtomicU8,
    /// Tokens sent and not yet answered.
    pub(super) in_flight: AtomicUsize,
    errors: AtomicU64,
    chunks: AtomicU64,
    /// Counts the replica's falls from ready to down: its chunks in flight stop waiting then.
    downs: tokio::sync::watch::Sender<u64>,
}

/// A replica as /info shows it.
#[derive(Debug, Serialize)]
pub struct ReplicaReport {
    pub url: String,
    pub model: Option<String>,
    pub state: State,
    pub in_flight_tokens: usize,
    pub chunks: u64,
    pub errors: u64,
}

impl Replica {
    fn new(url: String, origin: String, client: TulipClient) -> Replica {
        Replica {
            url,
            origin,
            client,
            info: OnceLock::new(),
            refusal: OnceLock::new(),
            state: AtomicU8::new(State::Starting as u8),
            in_flight: AtomicUsize::new(0),
            errors: AtomicU64::new(0),
            chunks: AtomicU64::new(0),
            downs: tokio::sync::watch::Sender::new(0),
        }
    }

    pub fn state(&self) -> State {
        State::from_u8(self.state.load(Ordering::Relaxed))
    }

    /// What it serves, once it has answered.
    pub fn info(&self) -> Option<&ModelInfo> {
        self.info.get()
    }

    /// Why it is refused, if it is.
    pub fn refusal(&self) -> Option<&str> {
        self.refusal.get().map(String::as_str)
    }

    fn set(&self, state: State) {
        let before = State::from_u8(self.state.swap(state as u8, Ordering::Relaxed));
        if before != state && before != State::Starting {
            tracing::info!("Tulip at {} is {state:?} (was {before:?})", self.url);
        }
        if before == State::Ready && state == State::Down {
            self.downs.send_modify(|n| *n += 1);
        }
        let model = self.info().map(|i| i.model_id.clone()).unwrap_or_default();
        let up = if state == State::Ready { 1.0 } else { 0.0 };
        metrics::gauge!("ivy_replica_ready", "replica" => self.url.clone(), "model" => model)
            .set(up);
    }

    /// Resolves when the replica next falls from ready to down (a failed health check or call).
    pub(super) fn went_down(&self) -> impl std::future::Future<Output = ()> + use<> {
        let mut downs = self.downs.subscribe();
        async move {
            let _ = downs.changed().await;
        }
    }

    pub(super) fn counted_chunk(&self) {
        self.chunks.fetch_add(1, Ordering::Relaxed);
    }

    fn report(&self) -> ReplicaReport {
        ReplicaReport {
            url: self.url.clone(),
            model: self.info().map(|i| i.model_id.clone()),
            state: self.state(),
            in_flight_tokens: self.in_flight.load(Ordering::Relaxed),
            chunks: self.chunks.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }
}

/// The replicas, shared by every model's [`super::ReplicaSet`].
pub struct Pool {
    members: RwLock<Arc<Vec<Arc<Replica>>>>,
    /// The first replica of each model name and what it serves: the others must match it.
    models: Mutex<Vec<(String, ModelInfo)>>,
    turn: AtomicUsize,
    watch: Watch,
    /// What Ivy sends to Tulips that need a key.
    keys: ApiKeys,
}

impl Pool {
    pub fn new(watch: Watch, keys: ApiKeys) -> Arc<Pool> {
        Arc::new(Pool {
            members: RwLock::new(Arc::new(Vec::new())),
            models: Mutex::new(Vec::new()),
            turn: AtomicUsize::new(0),
            watch,
            keys,
        })
    }

    /// A client of the Tulip at `url`, with this gateway's key.
    pub fn client(&self, url: &str) -> Result<TulipClient, TulipError> {
        TulipClient::new(url, &self.keys)
    }

    /// How long a health check may take.
    pub fn health_timeout(&self) -> Duration {
        self.watch.timeout
    }

    /// The replicas now (a snapshot).
    pub fn members(&self) -> Arc<Vec<Arc<Replica>>> {
        self.members.read().expect("pool lock").clone()
    }

    /// Adds a replica (named by `origin`); it takes chunks once its first health check passes.
    pub fn add(&self, url: String, origin: &str, client: TulipClient) -> Arc<Replica> {
        let replica = Arc::new(Replica::new(url, origin.to_string(), client));
        let mut members = self.members.write().expect("pool lock");
        let mut next = members.as_ref().clone();
        next.push(replica.clone());
        *members = Arc::new(next);
        replica
    }

    /// Makes `origin`'s replicas exactly `urls` (a re-resolved name): new ones join, gone ones
    /// leave (their chunks in flight still finish).
    pub fn sync(&self, origin: &str, urls: &[String]) {
        let current: Vec<String> = (self.members().iter())
            .filter(|r| r.origin == origin)
            .map(|r| r.url.clone())
            .collect();
        let (add, remove) = super::discovery::changes(&current, urls);
        for url in add {
            match self.client(&url) {
                Ok(client) => {
                    tracing::info!("{origin}: Tulip at {url} joins");
                    self.add(url, origin, client);
                }
                Err(err) => tracing::warn!("{origin}: {err}"),
            }
        }
        if !remove.is_empty() {
            tracing::info!("{origin}: Tulip at {} leaves", remove.join(", "));
            let mut members = self.members.write().expect("pool lock");
            let kept = (members.iter())
                .filter(|r| r.origin != origin || !remove.contains(&r.url))
                .cloned()
                .collect();
            *members = Arc::new(kept);
        }
    }

    /// The ready replica of `model` with the fewest tokens in flight (ties round-robin), other
    /// than `not`.
    pub fn pick(&self, model: &str, not: Option<&Arc<Replica>>) -> Option<Arc<Replica>> {
        let members = self.members();
        let loads: Vec<Option<usize>> = (members.iter())
            .map(|r| {
                let eligible = r.state() == State::Ready
                    && r.info().is_some_and(|i| i.model_id == model)
                    && not.is_none_or(|n| !Arc::ptr_eq(n, r));
                eligible.then(|| r.in_flight.load(Ordering::Relaxed))
            })
            .collect();
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        balance::pick(&loads, turn).map(|i| members[i].clone())
    }

    /// A call to `replica` failed for a transport reason: no new chunks until a health check
    /// passes again.
    pub fn failed(&self, replica: &Replica, why: &str) {
        replica.errors.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("ivy_replica_errors_total", "replica" => replica.url.clone())
            .increment(1);
        tracing::warn!("Tulip at {} failed a call: {why}", replica.url);
        if replica.state() == State::Ready {
            replica.set(State::Down);
        }
    }

    /// Checks every replica now, together.
    pub async fn check_all(&self) {
        let members = self.members();
        futures::future::join_all(members.iter().map(|r| self.check(r))).await;
        for r in members.iter() {
            let model = r.info().map(|i| i.model_id.clone()).unwrap_or_default();
            metrics::gauge!("ivy_replica_in_flight_tokens", "replica" => r.url.clone(), "model" => model)
                .set(r.in_flight.load(Ordering::Relaxed) as f64);
        }
    }

    /// Checks the replicas every interval, for ever.
    pub async fn watch(self: Arc<Pool>) {
        loop {
            self.check_all().await;
            tokio::time::sleep(self.watch.interval).await;
        }
    }

    /// One health check; a replica's first success also fetches what it serves.
    async fn check(&self, replica: &Replica) {
        if replica.state() == State::Refused {
            return;
        }
        let timeout = self.watch.timeout;
        let healthy = matches!(
            tokio::time::timeout(timeout, replica.client.health()).await,
            Ok(Ok(true))
        );
        if !healthy {
            if replica.state() != State::Starting {
                replica.set(State::Down);
            }
            return;
        }
        if replica.info().is_none() {
            let info = match tokio::time::timeout(timeout, replica.client.info()).await {
                Ok(Ok(answer)) => answer.model,
                // A key missing or wrong is configuration: no retry will mend it.
                Ok(Err(err)) if err.code() == tonic::Code::Unauthenticated => {
                    let why = format!(
                        "Tulip at {} refuses this gateway's API key: {err}",
                        replica.url
                    );
                    tracing::error!("{why}");
                    let _ = replica.refusal.set(why);
                    replica.set(State::Refused);
                    return;
                }
                _ => return,
            };
            let Some(info) = info else {
                tracing::error!("Tulip at {} reports no model", replica.url);
                return;
            };
            if let Err(why) = self.admit(&replica.url, &info) {
                tracing::error!("{why}");
                let _ = replica.refusal.set(why);
                let _ = replica.info.set(info);
                replica.set(State::Refused);
                return;
            }
            let _ = replica.info.set(info);
        }
        replica.set(State::Ready);
    }

    /// Registers what `url` serves; refuses it when another replica serves the same model name
    /// differently.
    fn admit(&self, url: &str, info: &ModelInfo) -> Result<(), String> {
        let mut models = self.models.lock().expect("models lock");
        match models.iter().find(|(_, m)| m.model_id == info.model_id) {
            Some((first, known)) => match differs(known, info) {
                Some(what) => Err(format!(
                    "Tulip at {url} is refused: it serves {} with {what}, unlike Tulip at {first}",
                    info.model_id
                )),
                None => Ok(()),
            },
            None => {
                models.push((url.to_string(), info.clone()));
                Ok(())
            }
        }
    }

    /// Each model name served, with what its first replica reported, in the order they came.
    pub fn models(&self) -> Vec<ModelInfo> {
        let models = self.models.lock().expect("models lock");
        models.iter().map(|(_, m)| m.clone()).collect()
    }

    /// Whether some replica of `model` (any model if None) is ready.
    pub fn any_ready(&self, model: Option<&str>) -> bool {
        self.members().iter().any(|r| {
            r.state() == State::Ready
                && model.is_none_or(|m| r.info().is_some_and(|i| i.model_id == m))
        })
    }

    /// Every replica, for /info, with its engine's live state as JSON (the fidelity check it ran
    /// at start, its graphs, ...) when it answers within the health timeout.
    pub async fn report(&self) -> Vec<(ReplicaReport, Option<String>)> {
        let members = self.members();
        let live = members.iter().map(|r| async move {
            let ready = r.state() == State::Ready;
            let info = tokio::time::timeout(self.watch.timeout, r.client.info());
            let engine = match ready {
                true => info.await.ok().and_then(Result::ok).map(|i| i.engine_json),
                false => None,
            };
            (r.report(), engine)
        });
        futures::future::join_all(live).await
    }

    /// Each replica's Prometheus text, by its address, from those that answer within the health
    /// timeout (one that is down is left out rather than holding up the scrape).
    pub async fn metrics(&self) -> Vec<(String, String)> {
        let members = self.members();
        let texts = members.iter().map(|r| async move {
            let text = tokio::time::timeout(self.watch.timeout, r.client.metrics()).await;
            match text {
                Ok(Ok(text)) => Some((r.url.clone(), text)),
                _ => None,
            }
        });
        futures::future::join_all(texts)
            .await
            .into_iter()
            .flatten()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> Arc<Pool> {
        Pool::new(
            Watch {
                interval: Duration::from_secs(1),
                timeout: Duration::from_secs(1),
            },
            ApiKeys::default(),
        )
    }

    fn ready(pool: &Pool, url: &str, model: &str) -> Arc<Replica> {
        let client = TulipClient::new(&format!("http://{url}"), &ApiKeys::default()).unwrap();
        let replica = pool.add(url.into(), "test", client);
        let info = ModelInfo {
            model_id: model.into(),
            dimensions: 4,
            ..Default::default()
        };
        pool.admit(url, &info).unwrap();
        replica.info.set(info).unwrap();
        replica.set(State::Ready);
        replica
    }

    #[tokio::test]
    async fn picks_ready_replicas_of_the_model_asked() {
        let pool = pool();
        let a = ready(&pool, "10.0.0.1:1", "m");
        let b = ready(&pool, "10.0.0.2:1", "m");
        ready(&pool, "10.0.0.3:1", "other");
        a.in_flight.store(100, Ordering::Relaxed);
        assert!(Arc::ptr_eq(&pool.pick("m", None).unwrap(), &b));
        assert!(Arc::ptr_eq(&pool.pick("m", Some(&b)).unwrap(), &a));
        pool.failed(&b, "test");
        assert_eq!(b.state(), State::Down);
        assert!(Arc::ptr_eq(&pool.pick("m", None).unwrap(), &a));
        assert!(pool.pick("m", Some(&a)).is_none());
        assert!(pool.pick("absent", None).is_none());
    }

    #[tokio::test]
    async fn a_model_served_differently_under_the_same_name_is_refused() {
        let pool = pool();
        ready(&pool, "10.0.0.1:1", "m");
        let wider = ModelInfo {
            model_id: "m".into(),
            dimensions: 8,
            ..Default::default()
        };
        let err = pool.admit("10.0.0.2:1", &wider).unwrap_err();
        assert!(
            err.contains("10.0.0.2:1") && err.contains("10.0.0.1:1"),
            "{err}"
        );
        assert!(err.contains("dimensions"), "{err}");
    }

    #[tokio::test]
    async fn sync_follows_the_resolved_names() {
        let pool = pool();
        let urls = |v: &[&str]| {
            v.iter()
                .map(|u| format!("http://{u}:7"))
                .collect::<Vec<_>>()
        };
        pool.sync("name", &urls(&["10.0.0.1", "10.0.0.2"]));
        pool.sync("name", &urls(&["10.0.0.2", "10.0.0.3"]));
        let now: Vec<String> = pool.members().iter().map(|r| r.url.clone()).collect();
        assert_eq!(now, urls(&["10.0.0.2", "10.0.0.3"]));
    }
}
