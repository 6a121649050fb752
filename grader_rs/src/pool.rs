//! SQL worker threads that never touch Python.
//!
//! Jobs go in with `submit`; each worker runs them on its own connections (one per database
//! file, reopened when the file's identity changes) and puts the outcome on a completion list.
//! A job may also be a call (`Task::Call`): work of the layer above that runs its own SQL (the
//! equivalence check on its small databases), so that it too counts against the pool's size.
//! The first completion after a `drain` writes one byte to a socket, so an event loop watching
//! `wake_fd` wakes up once and collects every outcome that is ready in one go. A worker needs no
//! interpreter lock at any point, so a job boundary never waits for the event loop's thread (or
//! the garbage collector) to let go of Python.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::compare::{self, Verdict};
use crate::digest::{Digest, DigestSpec};
use crate::error::{GradeError, Result};
use crate::exec::{self, ToolOptions, ToolOutput};
use crate::guard::{Budget, GuardedConnection};

/// Connections a worker keeps open; an RL run touches a few dozen databases, BIRD train ~70.
const MAX_CONNECTIONS_PER_WORKER: usize = 128;

pub enum Work {
    Tool(ToolOptions),
    Digest(DigestSpec),
    Grade(Digest),
}

/// A function run on a worker in place of a query; it gets the job's cancel flag.
pub type Call = Box<dyn FnOnce(Arc<AtomicBool>) -> Output + Send>;

pub enum Task {
    Query(Query),
    Call(Call),
}

pub struct Job {
    pub id: u64,
    pub task: Task,
}

/// SQL on a database file.
pub struct Query {
    pub path: String,
    /// (size, version) of the file as the caller saw it (t2sql.serving.manifest.FileIdentity): a
    /// connection opened on another identity is reopened (the file was replaced or written).
    pub identity: (u64, i64),
    pub sql: String,
    pub timeout_s: f64,
    /// The query's cap on temporary disk (guard::Budget's).
    pub max_temp_bytes: u64,
    pub work: Work,
}

pub enum Output {
    Tool(ToolOutput),
    /// The gold's digest and SQLite's seconds for it.
    Digest(Digest, f64),
    Verdict(Verdict),
    /// What a `Task::Call` returned, for its caller to downcast.
    Called(Box<dyn Any + Send>),
}

pub struct Completion {
    pub id: u64,
    pub result: Result<Output>,
}

struct Shared {
    queue: Mutex<VecDeque<Job>>,
    job_ready: Condvar,
    /// The cancel flag of every job submitted and not yet completed.
    flags: Mutex<HashMap<u64, Arc<AtomicBool>>>,
    done: Mutex<Vec<Completion>>,
    /// A wake byte is on its way and nobody has drained since.
    wake_pending: AtomicBool,
    wake_tx: UnixStream,
    closed: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub struct Pool {
    shared: Arc<Shared>,
    wake_rx: UnixStream,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Pool {
    /// `size` worker threads, each `nice` steps nicer than the caller (Linux; elsewhere ignored).
    pub fn new(size: usize, nice: i32) -> std::io::Result<Pool> {
        let (wake_tx, wake_rx) = UnixStream::pair()?;
        wake_tx.set_nonblocking(true)?; // a full socket means a wake is already pending
        wake_rx.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(VecDeque::new()),
            job_ready: Condvar::new(),
            flags: Mutex::new(HashMap::new()),
            done: Mutex::new(Vec::new()),
            wake_pending: AtomicBool::new(false),
            wake_tx,
            closed: AtomicBool::new(false),
        });
        let mut threads = Vec::with_capacity(size);
        for index in 0..size.max(1) {
            let shared = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(format!("t2sql-sql-{index}"))
                .spawn(move || {
                    lower_priority(nice);
                    work(&shared)
                })?;
            threads.push(handle);
        }
        Ok(Pool {
            shared,
            wake_rx,
            threads: Mutex::new(threads),
        })
    }

    /// The socket to watch for readability: readable means `drain` has something.
    pub fn wake_fd(&self) -> RawFd {
        self.wake_rx.as_raw_fd()
    }

    pub fn submit(&self, job: Job) -> Result<()> {
        if self.shared.closed.load(Ordering::SeqCst) {
            return Err(GradeError::Invalid("the SQL pool is closed".into()));
        }
        lock(&self.shared.flags).insert(job.id, Arc::new(AtomicBool::new(false)));
        lock(&self.shared.queue).push_back(job);
        self.shared.job_ready.notify_one();
        Ok(())
    }

    /// Cancel a job: a queued one completes as cancelled without running, a running one is
    /// interrupted at SQLite's next progress check. Unknown (finished) ids are ignored.
    pub fn cancel(&self, id: u64) {
        if let Some(flag) = lock(&self.shared.flags).get(&id) {
            flag.store(true, Ordering::SeqCst);
        }
    }

    /// Every completion ready now. The order matters: first empty the socket, then clear
    /// `wake_pending`, then take the list. A byte read here may come from a worker whose
    /// completion lands after the take; clearing the flag after the read makes that worker's
    /// successors write a new byte. (Clearing first lost wakes: a read could swallow the byte
    /// of a worker that had just set the flag, leaving it set with nothing to read.)
    pub fn drain(&self) -> Vec<Completion> {
        let mut sink = [0u8; 64];
        while let Ok(n) = (&self.wake_rx).read(&mut sink) {
            if n == 0 {
                break;
            }
        }
        self.shared.wake_pending.store(false, Ordering::SeqCst);
        std::mem::take(&mut *lock(&self.shared.done))
    }

    /// Stop the workers: running and queued jobs are cancelled (they complete as cancelled,
    /// ready for a last `drain`), then every thread is joined.
    pub fn close(&self) {
        self.stop();
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
    }

    /// Refuse new jobs and cancel every one submitted; the workers exit when the queue is empty.
    fn stop(&self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        for flag in lock(&self.shared.flags).values() {
            flag.store(true, Ordering::SeqCst);
        }
        self.shared.job_ready.notify_all();
    }
}

impl Drop for Pool {
    /// Stops the workers without waiting for them: a call job may be waiting for a lock the
    /// dropping thread holds (Python's, when the binding is dropped), so joining could deadlock.
    /// The workers own what they use and exit once their current job ends.
    fn drop(&mut self) {
        self.stop();
    }
}

fn work(shared: &Shared) {
    let mut connections: HashMap<String, ((u64, i64), GuardedConnection)> = HashMap::new();
    loop {
        let job = {
            let mut queue = lock(&shared.queue);
            loop {
                if let Some(job) = queue.pop_front() {
                    break job;
                }
                if shared.closed.load(Ordering::SeqCst) {
                    return;
                }
                queue = shared
                    .job_ready
                    .wait(queue)
                    .unwrap_or_else(|p| p.into_inner());
            }
        };
        let id = job.id;
        let flag = lock(&shared.flags).get(&id).cloned();
        let result = match (flag, job.task) {
            (Some(f), _) if f.load(Ordering::SeqCst) => Err(GradeError::Cancelled),
            (Some(f), Task::Query(query)) => run(&mut connections, &query, f),
            (Some(f), Task::Call(call)) => Ok(call(f)),
            (None, _) => Err(GradeError::Cancelled),
        };
        lock(&shared.flags).remove(&id);
        lock(&shared.done).push(Completion { id, result });
        if !shared.wake_pending.swap(true, Ordering::SeqCst) {
            // Non-blocking: if the socket is full, a byte is already waiting to be read.
            let _ = (&shared.wake_tx).write(&[1]);
        }
    }
}

fn run(
    connections: &mut HashMap<String, ((u64, i64), GuardedConnection)>,
    job: &Query,
    cancel: Arc<AtomicBool>,
) -> Result<Output> {
    let fresh =
        !matches!(connections.get(&job.path), Some((identity, _)) if *identity == job.identity);
    if fresh {
        let gc = GuardedConnection::open(&job.path, true)?;
        if connections.len() >= MAX_CONNECTIONS_PER_WORKER && !connections.contains_key(&job.path) {
            if let Some(victim) = connections.keys().next().cloned() {
                connections.remove(&victim);
            }
        }
        connections.insert(job.path.clone(), (job.identity, gc));
    }
    let gc = &connections[&job.path].1;
    let budget = Budget {
        timeout_s: job.timeout_s,
        cancel: Some(cancel),
        max_temp_bytes: job.max_temp_bytes,
    };
    match &job.work {
        Work::Tool(opts) => exec::run_tool(gc, &job.sql, *opts, &budget).map(Output::Tool),
        Work::Digest(spec) => {
            let start = Instant::now();
            compare::gold_digest(gc, &job.sql, *spec, &budget)
                .map(|d| Output::Digest(d, start.elapsed().as_secs_f64()))
        }
        Work::Grade(gold) => {
            compare::grade_against(gc, &job.sql, gold, &budget).map(Output::Verdict)
        }
    }
}

/// Make the calling thread `nice` steps nicer (Linux: niceness is per thread); where the OS
/// refuses, or on other systems, the thread keeps its priority.
#[cfg(target_os = "linux")]
pub fn lower_priority(nice: i32) {
    if nice <= 0 {
        return;
    }
    // SAFETY: plain syscalls on this thread's own id; a failure leaves the priority as it was.
    unsafe {
        let tid = libc::gettid() as libc::id_t;
        *libc::__errno_location() = 0;
        let current = libc::getpriority(libc::PRIO_PROCESS, tid);
        if current == -1 && *libc::__errno_location() != 0 {
            return;
        }
        libc::setpriority(libc::PRIO_PROCESS, tid, (current + nice).min(19));
    }
}

#[cfg(not(target_os = "linux"))]
pub fn lower_priority(_nice: i32) {}

#[cfg(test)]
mod test {
    use super::*;
    use std::time::Duration;

    const ENDLESS: &str =
        "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT COUNT(*) FROM r";

    fn fixture() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.sqlite");
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE t(x INTEGER); WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 1000) INSERT INTO t SELECT x FROM r;",
        )
        .unwrap();
        (dir, path.to_string_lossy().into_owned())
    }

    fn wait_for(pool: &Pool, n: usize) -> Vec<Completion> {
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while out.len() < n && Instant::now() < deadline {
            out.extend(pool.drain());
            std::thread::sleep(Duration::from_millis(1));
        }
        out
    }

    fn tool(id: u64, path: &str, sql: &str) -> Job {
        Job {
            id,
            task: Task::Query(Query {
                path: path.into(),
                identity: (0, 0),
                sql: sql.into(),
                timeout_s: 10.0,
                max_temp_bytes: crate::tempfiles::DEFAULT_MAX_TEMP_BYTES,
                work: Work::Tool(ToolOptions {
                    max_rows: 5,
                    max_cell_chars: 50,
                    max_chars: 1000,
                    count_cap: 100,
                }),
            }),
        }
    }

    #[test]
    fn every_job_completes_once_and_wakes_the_reader() {
        let (_dir, path) = fixture();
        let pool = Pool::new(2, 0).unwrap();
        for id in 0..50 {
            pool.submit(tool(id, &path, &format!("SELECT COUNT(*) + {id} FROM t")))
                .unwrap();
        }
        let mut done = wait_for(&pool, 50);
        done.sort_by_key(|c| c.id);
        assert_eq!(done.len(), 50);
        for (id, c) in done.iter().enumerate() {
            assert_eq!(c.id, id as u64);
            match &c.result {
                Ok(Output::Tool(out)) => assert!(out.text.contains(&(1000 + id).to_string())),
                _ => panic!("job {id} failed"),
            }
        }
        // A worker writes its wake byte after it pushes its completion, so the drain that took
        // the last completion may run before the last byte lands: one stale byte may remain
        // until the workers stop (a spurious wake, by design). Once they are joined, one more
        // drain finds no completion twice and leaves nothing to read.
        pool.close();
        assert!(pool.drain().is_empty(), "a job completed twice");
        let mut byte = [0u8; 1];
        assert!(
            (&pool.wake_rx).read(&mut byte).is_err(),
            "drained after the workers stopped: nothing left to read"
        );
    }

    /// A reader that only drains when the socket is readable (as an event loop does) must
    /// collect every completion: a lost wake leaves jobs finished but never collected.
    #[test]
    fn no_completion_is_left_without_a_wake() {
        let (_dir, path) = fixture();
        let pool = Pool::new(2, 0).unwrap();
        let total = 20_000u64;
        for id in 0..total {
            pool.submit(tool(id, &path, "SELECT 1")).unwrap();
        }
        let mut collected = 0u64;
        let fd = pool.wake_fd();
        while collected < total {
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            let ready = unsafe { libc::poll(&mut pfd, 1, 5000) };
            assert!(
                ready > 0,
                "no wake for 5 s with {} of {total} collected",
                collected
            );
            collected += pool.drain().len() as u64;
        }
        assert_eq!(collected, total);
    }

    #[test]
    fn cancel_interrupts_a_running_job_and_skips_a_queued_one() {
        let (_dir, path) = fixture();
        let pool = Pool::new(1, 0).unwrap();
        pool.submit(tool(1, &path, ENDLESS)).unwrap();
        pool.submit(tool(2, &path, "SELECT 1")).unwrap();
        pool.submit(tool(3, &path, "SELECT 3")).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        pool.cancel(1);
        pool.cancel(2);
        let mut done = wait_for(&pool, 3);
        assert!(started.elapsed() < Duration::from_secs(2));
        done.sort_by_key(|c| c.id);
        assert!(matches!(done[0].result, Err(GradeError::Cancelled)));
        assert!(matches!(done[1].result, Err(GradeError::Cancelled)));
        assert!(matches!(done[2].result, Ok(Output::Tool(_))));
    }

    #[test]
    fn close_cancels_what_is_running_and_joins() {
        let (_dir, path) = fixture();
        let pool = Pool::new(1, 0).unwrap();
        pool.submit(tool(1, &path, ENDLESS)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        pool.close();
        assert!(started.elapsed() < Duration::from_secs(2));
        let done = pool.drain();
        assert_eq!(done.len(), 1);
        assert!(matches!(done[0].result, Err(GradeError::Cancelled)));
        assert!(pool.submit(tool(2, &path, "SELECT 1")).is_err());
    }

    /// A call takes a worker like a query does: on a pool of one, the query queued behind a
    /// call starts only once the call returns; the call sees its own cancel flag.
    #[test]
    fn a_call_holds_a_worker_and_sees_its_cancel_flag() {
        let (_dir, path) = fixture();
        let pool = Pool::new(1, 0).unwrap();
        let started = Instant::now();
        let call: Call = Box::new(|flag: Arc<AtomicBool>| {
            while !flag.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            Output::Called(Box::new(Instant::now()))
        });
        pool.submit(Job {
            id: 1,
            task: Task::Call(call),
        })
        .unwrap();
        pool.submit(tool(2, &path, "SELECT 2")).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(pool.drain().is_empty(), "the query ran beside the call");
        pool.cancel(1);
        let mut done = wait_for(&pool, 2);
        done.sort_by_key(|c| c.id);
        assert!(started.elapsed() < Duration::from_secs(5));
        let returned_at = match &done[0].result {
            Ok(Output::Called(value)) => *value.downcast_ref::<Instant>().expect("an Instant"),
            _ => panic!("the call did not return its value"),
        };
        assert!(returned_at.duration_since(started) >= Duration::from_millis(200));
        assert!(matches!(done[1].result, Ok(Output::Tool(_))));
    }

    /// Each worker's query is held to its own cap on temporary disk, whatever the others use.
    #[test]
    fn each_query_on_the_workers_has_its_own_temp_cap() {
        let (_dir, path) = fixture();
        let pool = Pool::new(2, 0).unwrap();
        // 1M pairs of the fixture's 1000 rows, sorted before the first comes out: several MiB
        // of sorter runs.
        let sorted = "SELECT a.x, b.x FROM t a, t b ORDER BY b.x - a.x";
        let capped = |id, max_temp_bytes| Job {
            id,
            task: Task::Query(Query {
                path: path.clone(),
                identity: (0, 0),
                sql: sorted.into(),
                timeout_s: 60.0,
                max_temp_bytes,
                work: Work::Tool(ToolOptions::FOR_TESTS),
            }),
        };
        let small = 1 << 20;
        for id in 0..4 {
            let cap = if id % 2 == 0 {
                small
            } else {
                crate::tempfiles::DEFAULT_MAX_TEMP_BYTES
            };
            pool.submit(capped(id, cap)).unwrap();
        }
        let mut done = wait_for(&pool, 4);
        done.sort_by_key(|c| c.id);
        assert_eq!(done.len(), 4);
        for c in &done {
            match (&c.result, c.id % 2) {
                (Err(GradeError::TempDisk(cap)), 0) => assert_eq!(*cap, small),
                (Ok(Output::Tool(out)), 1) => assert_eq!(out.row_count, 10_000),
                _ => panic!("job {}: {:?}", c.id, c.result.as_ref().err()),
            }
        }
    }

    #[test]
    fn a_queued_call_that_is_cancelled_never_runs() {
        let (_dir, path) = fixture();
        let pool = Pool::new(1, 0).unwrap();
        pool.submit(tool(1, &path, ENDLESS)).unwrap();
        let ran = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&ran);
        let call: Call = Box::new(move |_| {
            seen.store(true, Ordering::SeqCst);
            Output::Called(Box::new(()))
        });
        pool.submit(Job {
            id: 2,
            task: Task::Call(call),
        })
        .unwrap();
        pool.cancel(2);
        pool.cancel(1);
        let done = wait_for(&pool, 2);
        assert_eq!(done.len(), 2);
        assert!(done
            .iter()
            .all(|c| matches!(c.result, Err(GradeError::Cancelled))));
        assert!(!ran.load(Ordering::SeqCst));
    }
}
