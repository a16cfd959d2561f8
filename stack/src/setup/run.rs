//! Running a built stack: on the calling thread and the stack's other
//! lcores (run-to-completion), or in the background while application
//! threads use the sockets.

use std::sync::Arc;

use spate_dpdk::lcore;

use crate::control_plane::Stack;
use crate::engine::{LcoreCtx, Worker};
use crate::error::{Error, Result};
use crate::shared::WorkerQueues;

/// A stack polling on worker lcores in the background (from [`Stack::spawn`]).
#[derive(Debug)]
pub struct Running {
    stack: Stack,
    joins: Vec<lcore::LcoreJoin>,
}

impl Running {
    /// Stops the lcores and waits for them.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stack.shared.request_stop();
        for j in self.joins.drain(..) {
            j.join();
        }
        self.stack.shared.stopped();
    }

    /// The stack.
    pub fn stack(&self) -> &Stack {
        &self.stack
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.halt();
    }
}

impl Stack {
    /// Polls on every lcore of the stack until [`stop`](Self::stop) or a
    /// signal. `app(index)` is called on each lcore to make its callback,
    /// which then runs once per loop iteration (run-to-completion). The
    /// calling thread must be the EAL main lcore if that is one of the
    /// stack's lcores; it polls as that lcore.
    pub fn run<F, H>(&self, app: F) -> Result<()>
    where
        F: Fn(usize) -> H + Send + Sync + 'static,
        H: FnMut(&mut LcoreCtx<'_>) + 'static,
    {
        let here = lcore::current();
        let main = lcore::main_lcore();
        if self.shared.lcores.contains(&main) && here != Some(main) {
            return Err(Error::State(format!(
                "lcore {main} is the EAL main lcore: call run() on the thread that started the EAL"
            )));
        }
        let app = Arc::new(app);
        let mut queues = self.shared.lifecycle.start()?;
        self.shared.came_up();
        let mut joins = Vec::new();
        let mut local = None;
        for (idx, q) in queues.drain(..).enumerate() {
            let l = self.shared.lcores[idx];
            if Some(l) == here {
                local = Some((idx, l, q));
                continue;
            }
            match self.launch(idx, l, q, app.clone()) {
                Ok(j) => joins.push(j),
                Err(e) => {
                    self.stop();
                    for j in joins {
                        j.join();
                    }
                    self.shared.stopped();
                    return Err(e);
                }
            }
        }
        if let Some((idx, l, q)) = local {
            let mut w = Worker::new(idx, l, self, q);
            let mut h = app(idx);
            w.run(&mut h);
            self.shared.went_down();
            self.shared.lifecycle.give_back(idx, w.into_queues());
            // This lcore stopped (a signal, `stop`): the others follow.
            self.stop();
        }
        // Without a local lcore the calling thread waits here until the
        // lcores stop on their own (a signal, `stop` from another thread).
        for j in joins {
            j.join();
        }
        self.shared.stopped();
        Ok(())
    }

    /// Polls on the stack's lcores in the background (none of them may be
    /// the calling thread's); application threads use sockets meanwhile.
    pub fn spawn<F, H>(&self, app: F) -> Result<Running>
    where
        F: Fn(usize) -> H + Send + Sync + 'static,
        H: FnMut(&mut LcoreCtx<'_>) + 'static,
    {
        let here = lcore::current();
        if let Some(l) = self.shared.lcores.iter().find(|l| Some(**l) == here || **l == lcore::main_lcore()) {
            return Err(Error::State(format!("lcore {l} is the calling thread's or the EAL main lcore: use run()")));
        }
        let app = Arc::new(app);
        let mut queues = self.shared.lifecycle.start()?;
        self.shared.came_up();
        let mut joins = Vec::new();
        for (idx, q) in queues.drain(..).enumerate() {
            match self.launch(idx, self.shared.lcores[idx], q, app.clone()) {
                Ok(j) => joins.push(j),
                Err(e) => {
                    drop(Running { stack: self.clone(), joins });
                    return Err(e);
                }
            }
        }
        Ok(Running { stack: self.clone(), joins })
    }

    /// Polls in the background with no application callback (thread mode).
    pub fn spawn_polling(&self) -> Result<Running> {
        self.spawn(|_| |_: &mut LcoreCtx<'_>| {})
    }

    fn launch<F, H>(&self, idx: usize, l: u32, q: WorkerQueues, app: Arc<F>) -> Result<lcore::LcoreJoin>
    where
        F: Fn(usize) -> H + Send + Sync + 'static,
        H: FnMut(&mut LcoreCtx<'_>) + 'static,
    {
        let stack = self.clone();
        let job = lcore::launch(l, move || {
            let mut w = Worker::new(idx, l, &stack, q);
            let mut h = app(idx);
            w.run(&mut h);
            // Blocked calls end as soon as one lcore stops, joined or not
            // (the README's program blocks in a receive, never joining).
            stack.shared.went_down();
            let q = w.into_queues();
            stack.shared.lifecycle.give_back(idx, q);
            0
        });
        job.map_err(Error::from)
    }
}
