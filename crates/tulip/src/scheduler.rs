//! The scheduler: one engine thread owns the queue and the engine, one waiter thread turns
//! in-flight results into answers, and a cheap [`Scheduler`] handle submits work from async code.
//!
//! The engine thread never waits on the device: `step` returns a [`Pending`] result, which is
//! handed to the waiter thread through a rendezvous channel. So while batch N is computed, batch
//! N+1 is already enqueued, and no more than that: the engine thread blocks on the hand-over until
//! the waiter has finished N. Async callers only await a oneshot channel.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::engine::{Batch, Engine, Pending, Pooled, Probe, Served};
use crate::error::{EngineError, TulipError};
use crate::packing::{take_batch_small_first, Budget, Queued};

/// Requests of at most this many tokens (a query, a few short texts) are packed ahead of larger
/// ones, so that a client batch's chunks never queue a query behind them.
pub const SMALL_REQUEST_TOKENS: usize = 1024;

/// Handle to the engine thread; cloning it is cheap.
#[derive(Clone)]
pub struct Scheduler {
    submit: mpsc::UnboundedSender<Arc<Job>>,
    /// Set once a step fails fatally (EngineError::Fatal): the engine serves nothing more.
    broken: Arc<AtomicBool>,
    served: Arc<Served>,
    budget: Budget,
    probe: Probe,
}

/// The pooled vectors of one request, with where its time went.
#[derive(Debug)]
pub struct Answer {
    pub pooled: Pooled,
    /// From submission until its first sequence went into a batch.
    pub queue_time: Duration,
    /// From then until its last vector was on the host.
    pub inference_time: Duration,
}

impl Scheduler {
    /// Starts the engine thread, builds the engine on it with `load` (so that thread-bound state
    /// such as a CUDA stream belongs to it), and returns once the engine is ready. Batches are
    /// packed under the limits the engine reports it is sized for.
    pub fn start<E, F>(load: F) -> Result<Scheduler, TulipError>
    where
        E: Engine,
        F: FnOnce() -> Result<(E, Served), EngineError> + Send + 'static,
    {
        let (submit, incoming) = mpsc::unbounded_channel();
        let (loaded_tx, loaded_rx) = std::sync::mpsc::channel();
        let broken = Arc::new(AtomicBool::new(false));
        let (engine_broken, waiter_broken) = (broken.clone(), broken.clone());
        thread::Builder::new()
            .name("tulip-engine".into())
            .spawn(move || {
                E::run_thread(move || match load() {
                    Ok((engine, served)) => {
                        let budget = Budget::of(&served.model);
                        let _ = loaded_tx.send(Ok((served, engine.probe())));
                        let (to_waiter, in_flight) = sync_channel(0);
                        thread::Builder::new()
                            .name("tulip-waiter".into())
                            .spawn(move || {
                                E::run_thread(move || {
                                    waiter_loop::<E::Pending>(in_flight, &waiter_broken)
                                })
                            })
                            .expect("spawn the waiter thread");
                        engine_loop(engine, incoming, budget, to_waiter, &engine_broken);
                    }
                    Err(err) => {
                        let _ = loaded_tx.send(Err(err));
                    }
                })
            })
            .expect("spawn the engine thread");
        let (served, probe) = loaded_rx.recv().map_err(|_| TulipError::Stopped)??;
        let budget = Budget::of(&served.model);
        Ok(Scheduler {
            submit,
            broken,
            served: Arc::new(served),
            budget,
            probe,
        })
    }

    /// What the engine serves.
    pub fn served(&self) -> &Served {
        &self.served
    }

    /// The batch limits the scheduler packs under.
    pub fn budget(&self) -> Budget {
        self.budget
    }

    /// The engine's live state as a JSON object (may wait for the engine's lock: call it off
    /// the async executor).
    pub fn probe(&self) -> String {
        (self.probe)()
    }

    /// True while the engine thread runs and no step has failed fatally.
    pub fn is_ready(&self) -> bool {
        !self.submit.is_closed() && !self.is_broken()
    }

    /// True once a step failed fatally: the process must restart to serve again.
    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    /// Queues the sequences and waits for the engine's rows of them (pooled vectors, or a score
    /// model's logits). Dropping the future withdraws the sequences not yet batched.
    pub async fn run(&self, sequences: Sequences) -> Result<Answer, TulipError> {
        let (reply, answer) = oneshot::channel();
        let job = Arc::new(Job::new(sequences, reply));
        self.submit.send(job).map_err(|_| TulipError::Stopped)?;
        answer.await.map_err(|_| TulipError::Stopped)?
    }
}

/// The sequences of one request: `token_ids[offsets[i]..offsets[i + 1]]` is sequence i.
#[derive(Debug, Clone, Default)]
pub struct Sequences {
    pub token_ids: Vec<u32>,
    /// One per token id, or empty (all 0).
    pub token_type_ids: Vec<u32>,
    pub offsets: Vec<usize>,
    /// A row a token in the answer (sequence i's at rows `offsets[i]..offsets[i + 1]`), from the
    /// engine's token step, instead of a row a sequence.
    pub per_token: bool,
}

/// One request: several sequences answered together.
struct Job {
    sequences: Sequences,
    submitted: Instant,
    state: Mutex<JobState>,
}

struct JobState {
    data: Vec<f32>,
    dim: usize,
    remaining: usize,
    started: Option<Instant>,
    reply: Option<oneshot::Sender<Result<Answer, TulipError>>>,
}

impl Job {
    fn new(sequences: Sequences, reply: oneshot::Sender<Result<Answer, TulipError>>) -> Job {
        let remaining = sequences.offsets.len().saturating_sub(1);
        let state = JobState {
            data: Vec::new(),
            dim: 0,
            remaining,
            started: None,
            reply: Some(reply),
        };
        Job {
            sequences,
            submitted: Instant::now(),
            state: Mutex::new(state),
        }
    }

    fn sequences(&self) -> usize {
        self.sequences.offsets.len().saturating_sub(1)
    }

    fn tokens(&self, index: usize) -> &[u32] {
        let s = &self.sequences;
        &s.token_ids[s.offsets[index]..s.offsets[index + 1]]
    }

    fn types(&self, index: usize) -> Option<&[u32]> {
        let s = &self.sequences;
        (!s.token_type_ids.is_empty())
            .then(|| &s.token_type_ids[s.offsets[index]..s.offsets[index + 1]])
    }

    fn state(&self) -> std::sync::MutexGuard<'_, JobState> {
        // A panic while holding this lock cannot leave the state half-written in a way that
        // matters more than answering, so a poisoned lock is used as is.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn mark_started(&self, at: Instant) {
        self.state().started.get_or_insert(at);
    }

    /// Sequence `index`'s rows (one, or with `per_token` one a token) of `dim` values each.
    fn complete(&self, index: usize, rows: &[f32], dim: usize) {
        let mut state = self.state();
        if state.reply.is_none() {
            return;
        }
        let s = &self.sequences;
        let (total, first) = match s.per_token {
            true => (s.token_ids.len(), s.offsets[index]),
            false => (self.sequences(), index),
        };
        if state.data.is_empty() {
            state.dim = dim;
            state.data = vec![0.0; dim * total];
        }
        state.data[first * dim..first * dim + rows.len()].copy_from_slice(rows);
        state.remaining -= 1;
        if state.remaining == 0 {
            let now = Instant::now();
            let started = state.started.unwrap_or(now);
            let answer = Answer {
                pooled: Pooled {
                    dim,
                    data: std::mem::take(&mut state.data),
                },
                queue_time: started - self.submitted,
                inference_time: now - started,
            };
            if let Some(reply) = state.reply.take() {
                let _ = reply.send(Ok(answer));
            }
        }
    }

    fn fail(&self, err: &EngineError) {
        if let Some(reply) = self.state().reply.take() {
            let _ = reply.send(Err(err.clone().into()));
        }
    }
}

/// One sequence of a job, waiting in the queue or riding in a batch.
struct Sequence {
    job: Arc<Job>,
    index: usize,
}

impl Queued for Sequence {
    fn tokens(&self) -> usize {
        let offsets = &self.job.sequences.offsets;
        offsets[self.index + 1] - offsets[self.index]
    }

    fn is_wanted(&self) -> bool {
        self.job
            .state()
            .reply
            .as_ref()
            .is_some_and(|reply| !reply.is_closed())
    }

    fn per_token(&self) -> bool {
        self.job.sequences.per_token
    }
}

struct InFlight<P> {
    pending: P,
    members: Vec<Sequence>,
}

fn engine_loop<E: Engine>(
    mut engine: E,
    mut incoming: mpsc::UnboundedReceiver<Arc<Job>>,
    budget: Budget,
    to_waiter: SyncSender<InFlight<E::Pending>>,
    broken: &AtomicBool,
) {
    let (mut small, mut bulk) = (VecDeque::new(), VecDeque::new());
    loop {
        if small.is_empty() && bulk.is_empty() {
            match incoming.blocking_recv() {
                Some(job) => enqueue(&mut small, &mut bulk, job),
                None => return,
            }
        }
        while let Ok(job) = incoming.try_recv() {
            enqueue(&mut small, &mut bulk, job);
        }
        if broken.load(Ordering::Acquire) {
            // Everything queued, and everything sent from now on, fails at once rather than waits.
            let err = EngineError::Fatal("an earlier step left the device unusable".into());
            incoming.close();
            while let Ok(job) = incoming.try_recv() {
                enqueue(&mut small, &mut bulk, job);
            }
            small
                .drain(..)
                .chain(bulk.drain(..))
                .for_each(|seq| seq.job.fail(&err));
            return;
        }
        let members = take_batch_small_first(&mut small, &mut bulk, budget);
        metrics::gauge!("tulip_queue_sequences").set((small.len() + bulk.len()) as f64);
        if members.is_empty() {
            continue;
        }
        let mut batch = Batch {
            per_token: members[0].per_token(),
            ..Batch::default()
        };
        let started = Instant::now();
        for seq in &members {
            batch.push(seq.job.tokens(seq.index), seq.job.types(seq.index));
            seq.job.mark_started(started);
        }
        metrics::histogram!("tulip_batch_sequences").record(batch.len() as f64);
        metrics::histogram!("tulip_batch_tokens").record(batch.token_ids.len() as f64);
        let stepped = engine.step(&batch);
        metrics::histogram!("tulip_step_duration_seconds").record(started.elapsed().as_secs_f64());
        match stepped {
            Ok(pending) => {
                if to_waiter.send(InFlight { pending, members }).is_err() {
                    return;
                }
            }
            Err(err) => {
                metrics::counter!("tulip_engine_faults_total").increment(1);
                tracing::error!(
                    "engine step of {} tokens in {} sequences failed: {err}",
                    batch.token_ids.len(),
                    batch.len()
                );
                if matches!(err, EngineError::Fatal(_)) {
                    broken.store(true, Ordering::Release);
                }
                members.iter().for_each(|seq| seq.job.fail(&err));
            }
        }
    }
}

fn enqueue(small: &mut VecDeque<Sequence>, bulk: &mut VecDeque<Sequence>, job: Arc<Job>) {
    let queue = if job.sequences.token_ids.len() <= SMALL_REQUEST_TOKENS {
        small
    } else {
        bulk
    };
    queue.extend((0..job.sequences()).map(|index| Sequence {
        job: job.clone(),
        index,
    }));
}

/// The rows a batch of `members` answers: one a sequence, or one a token in a token step.
fn rows_of(members: &[Sequence]) -> usize {
    (members.iter())
        .map(|seq| if seq.per_token() { seq.tokens() } else { 1 })
        .sum()
}

fn waiter_loop<P: Pending>(in_flight: Receiver<InFlight<P>>, broken: &AtomicBool) {
    for InFlight { pending, members } in in_flight {
        match pending.wait() {
            Ok(pooled) if pooled.data.len() != rows_of(&members) * pooled.dim => {
                let err = EngineError::Fault(format!(
                    "the engine answered {} values for {} rows of {}",
                    pooled.data.len(),
                    rows_of(&members),
                    pooled.dim
                ));
                tracing::error!("{err}");
                members.iter().for_each(|seq| seq.job.fail(&err));
            }
            Ok(pooled) => {
                let mut row = 0;
                for seq in &members {
                    let rows = if seq.per_token() { seq.tokens() } else { 1 };
                    let values = &pooled.data[row * pooled.dim..(row + rows) * pooled.dim];
                    seq.job.complete(seq.index, values, pooled.dim);
                    row += rows;
                }
            }
            Err(err) => {
                metrics::counter!("tulip_engine_faults_total").increment(1);
                tracing::error!("engine result of {} sequences failed: {err}", members.len());
                if matches!(err, EngineError::Fatal(_)) {
                    broken.store(true, Ordering::Release);
                }
                members.iter().for_each(|seq| seq.job.fail(&err));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine whose vector for a sequence is [its length, its first token id].
    struct Echo;

    struct Ready(Result<Pooled, EngineError>);

    impl Pending for Ready {
        fn wait(self) -> Result<Pooled, EngineError> {
            self.0
        }
    }

    impl Engine for Echo {
        type Pending = Ready;
        fn step(&mut self, batch: &Batch) -> Result<Ready, EngineError> {
            if batch.token_ids.contains(&666) {
                return Err(EngineError::Fault("bad token".into()));
            }
            if batch.token_ids.contains(&999) {
                return Err(EngineError::Fatal("the device is gone".into()));
            }
            if batch.per_token {
                let data = batch.token_ids.iter().map(|&id| id as f32).collect();
                return Ok(Ready(Ok(Pooled { dim: 1, data })));
            }
            let data = batch
                .cu_seqlens
                .windows(2)
                .flat_map(|w| [(w[1] - w[0]) as f32, batch.token_ids[w[0] as usize] as f32])
                .collect();
            Ok(Ready(Ok(Pooled { dim: 2, data })))
        }
    }

    fn sized(max_batch_tokens: u32, max_batch_requests: u32) -> Served {
        Served {
            model: crate::proto::ModelInfo {
                max_batch_tokens,
                max_batch_requests,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn seqs(token_ids: Vec<u32>, offsets: Vec<usize>) -> Sequences {
        Sequences {
            token_ids,
            offsets,
            ..Default::default()
        }
    }

    fn start(max_tokens: u32) -> Scheduler {
        Scheduler::start(move || Ok((Echo, sized(max_tokens, 4)))).unwrap()
    }

    #[tokio::test]
    async fn answers_each_request_in_its_own_order() {
        let scheduler = start(8);
        let out = scheduler
            .run(seqs(vec![7, 8, 9, 1, 2, 3, 4, 5, 6], vec![0, 3, 4, 9]))
            .await
            .unwrap();
        assert_eq!(out.pooled.data, [3.0, 7.0, 1.0, 1.0, 5.0, 2.0]);
    }

    #[tokio::test]
    async fn a_token_step_answers_a_row_a_token_beside_pooled_requests() {
        let scheduler = start(64);
        let tokens = Sequences {
            per_token: true,
            ..seqs(vec![7, 8, 9, 1, 2], vec![0, 3, 5])
        };
        let (pooled, per_token) = tokio::join!(
            scheduler.run(seqs(vec![4, 5], vec![0, 2])),
            scheduler.run(tokens)
        );
        assert_eq!(pooled.unwrap().pooled.data, [2.0, 4.0]);
        let per_token = per_token.unwrap().pooled;
        assert_eq!(
            (per_token.dim, per_token.data),
            (1, vec![7.0, 8.0, 9.0, 1.0, 2.0])
        );
    }

    #[tokio::test]
    async fn many_concurrent_requests_each_get_their_own_vectors() {
        let scheduler = start(16);
        let calls = (1..=64u32).map(|i| {
            let scheduler = scheduler.clone();
            async move {
                (
                    i,
                    scheduler
                        .run(seqs(
                            vec![i; i as usize % 5 + 1],
                            vec![0, i as usize % 5 + 1],
                        ))
                        .await,
                )
            }
        });
        for (i, out) in futures::future::join_all(calls).await {
            assert_eq!(out.unwrap().pooled.data, [(i % 5 + 1) as f32, i as f32]);
        }
    }

    #[tokio::test]
    async fn an_engine_error_fails_its_batch_and_the_engine_keeps_serving() {
        let scheduler = start(4);
        let err = scheduler
            .run(seqs(vec![666], vec![0, 1]))
            .await
            .unwrap_err();
        assert!(matches!(err, TulipError::Engine(EngineError::Fault(_))));
        assert!(scheduler.run(seqs(vec![1], vec![0, 1])).await.is_ok());
    }

    #[tokio::test]
    async fn a_fatal_error_stops_the_engine_and_fails_what_comes_after() {
        let scheduler = start(4);
        assert!(scheduler.is_ready());
        let err = scheduler
            .run(seqs(vec![999], vec![0, 1]))
            .await
            .unwrap_err();
        assert!(matches!(err, TulipError::Engine(EngineError::Fatal(_))));
        assert!(scheduler.is_broken() && !scheduler.is_ready());
        let next = scheduler.run(seqs(vec![1], vec![0, 1])).await.unwrap_err();
        assert!(matches!(
            next,
            TulipError::Engine(EngineError::Fatal(_)) | TulipError::Stopped
        ));
    }

    /// An engine that holds its first step until released, and records what it was given.
    struct Gated {
        release: std::sync::mpsc::Receiver<()>,
        seen: Arc<Mutex<Vec<Vec<u32>>>>,
    }

    impl Engine for Gated {
        type Pending = Ready;
        fn step(&mut self, batch: &Batch) -> Result<Ready, EngineError> {
            if self.seen.lock().unwrap().is_empty() {
                self.release.recv().unwrap();
            }
            self.seen.lock().unwrap().push(batch.token_ids.clone());
            Ok(Ready(Ok(Pooled {
                dim: 1,
                data: vec![0.0; batch.len()],
            })))
        }
    }

    #[tokio::test]
    async fn sequences_whose_client_has_gone_are_skipped() {
        let (release, gate) = std::sync::mpsc::channel();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        let load = move || {
            let engine = Gated {
                release: gate,
                seen: recorded,
            };
            Ok((engine, sized(1, 1)))
        };
        let scheduler = Scheduler::start(load).unwrap();

        let first = tokio::spawn({
            let scheduler = scheduler.clone();
            async move { scheduler.run(seqs(vec![1], vec![0, 1])).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Queued behind the held step; its client gives up before it is batched.
        let gone = tokio::time::timeout(
            Duration::from_millis(50),
            scheduler.run(seqs(vec![2], vec![0, 1])),
        )
        .await;
        assert!(gone.is_err());
        release.send(()).unwrap();
        first.await.unwrap().unwrap();
        scheduler.run(seqs(vec![3], vec![0, 1])).await.unwrap();
        assert_eq!(*seen.lock().unwrap(), [vec![1], vec![3]]);
    }
}
