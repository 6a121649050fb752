//! The deadline and the cancel token of one call: `Budget` (what a caller gives a call),
//! `RunControl` (what the progress handler asks every PROGRESS_STEPS VM steps), and arming and
//! disarming them around each call.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::GuardedConnection;
use crate::error::{GradeError, Result};
use crate::tempfiles;

/// How many VM steps between two deadline checks (overhead lost in noise, latency ~µs).
pub(super) const PROGRESS_STEPS: i32 = 1000;

/// Why the last query was stopped by the progress handler.
pub(super) const STOP_NONE: u8 = 0;
pub(super) const STOP_TIMEOUT: u8 = 1;
pub(super) const STOP_CANCEL: u8 = 2;

/// Deadline and cancellation shared with the progress handler.
pub struct RunControl {
    base: Instant,
    deadline_ns: AtomicU64,
    cancel: Mutex<Option<Arc<AtomicBool>>>,
    pub(super) stopped: AtomicU8,
}

impl RunControl {
    pub(super) fn new() -> Self {
        RunControl {
            base: Instant::now(),
            deadline_ns: AtomicU64::new(u64::MAX),
            cancel: Mutex::new(None),
            stopped: AtomicU8::new(STOP_NONE),
        }
    }

    pub(super) fn should_stop(&self) -> bool {
        if let Some(flag) = self.cancel.lock().unwrap().as_ref() {
            if flag.load(Ordering::Relaxed) {
                self.stopped.store(STOP_CANCEL, Ordering::Relaxed);
                return true;
            }
        }
        if self.base.elapsed().as_nanos() as u64 >= self.deadline_ns.load(Ordering::Relaxed) {
            self.stopped.store(STOP_TIMEOUT, Ordering::Relaxed);
            return true;
        }
        false
    }
}

/// A deadline, an optional cancel token and a cap on temporary disk, for one call.
#[derive(Clone)]
pub struct Budget {
    pub timeout_s: f64,
    pub cancel: Option<Arc<AtomicBool>>,
    /// Bytes of temporary files (sorts, temporary b-trees) the call's query may hold at once.
    pub max_temp_bytes: u64,
}

impl Budget {
    /// A deadline, no cancel token, the default cap on temporary disk.
    pub fn new(timeout_s: f64) -> Self {
        Budget {
            timeout_s,
            cancel: None,
            max_temp_bytes: tempfiles::DEFAULT_MAX_TEMP_BYTES,
        }
    }

    pub fn with_max_temp_bytes(self, max_temp_bytes: u64) -> Self {
        Budget {
            max_temp_bytes,
            ..self
        }
    }
}

impl GuardedConnection {
    /// Arm the deadline and the cancel token for one call; `disarm` must follow.
    pub fn arm(&self, budget: &Budget) -> Result<()> {
        if let Some(flag) = &budget.cancel {
            if flag.load(Ordering::Relaxed) {
                return Err(GradeError::Cancelled);
            }
        }
        let now = self.control.base.elapsed();
        let deadline = now + Duration::from_secs_f64(budget.timeout_s.clamp(0.0, 1e9));
        self.control
            .deadline_ns
            .store(deadline.as_nanos() as u64, Ordering::Relaxed);
        *self.control.cancel.lock().unwrap() = budget.cancel.clone();
        self.control.stopped.store(STOP_NONE, Ordering::Relaxed);
        // Temporary files opened on this thread from now on are this connection's, under the
        // call's cap (files still open from an earlier statement count against it too).
        self.temp.start_query(budget.max_temp_bytes);
        tempfiles::set_current(Some(Arc::clone(&self.temp)));
        Ok(())
    }

    pub fn disarm(&self) {
        self.control.deadline_ns.store(u64::MAX, Ordering::Relaxed);
        *self.control.cancel.lock().unwrap() = None;
        tempfiles::set_current(None);
    }

    /// Whether the armed call's deadline has passed or its cancel token fired (asked by work
    /// the progress handler does not reach: the end of a digest that spilled).
    pub fn interrupted(&self) -> bool {
        self.control.should_stop()
    }

    /// The error for a call `interrupted` stopped.
    pub fn stop_error(&self, budget: &Budget) -> GradeError {
        match self.control.stopped.load(Ordering::Relaxed) {
            STOP_TIMEOUT => GradeError::Timeout(budget.timeout_s),
            _ => GradeError::Cancelled,
        }
    }
}
