//! The logits of a submitted step, read back as a future: the browser awaits it (WebGPU maps the
//! buffer on its event loop); native code blocks on [`PendingLogits::wait`], which polls the device.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};

use crate::{Error, Result};

/// What the map callback has reported.
#[derive(Default)]
struct MapState {
    done: Option<std::result::Result<(), wgpu::BufferAsyncError>>,
    waker: Option<Waker>,
}

/// Read-back buffers reused from step to step: a buffer is free again once its logits were read
/// (one whose [`PendingLogits`] was dropped unread is never reused).
#[derive(Default)]
pub(super) struct StagingPool {
    buffers: Vec<(wgpu::Buffer, Arc<AtomicBool>)>,
}

/// Buffers a pool keeps at most (sizes in use: one row of logits, and a batch's rows).
const POOL_SIZE: usize = 4;

impl StagingPool {
    /// A free buffer of exactly `bytes`, marked busy (created when there is none).
    pub(super) fn take(
        &mut self,
        ctx: &crate::gpu::GpuContext,
        bytes: u64,
    ) -> (wgpu::Buffer, Arc<AtomicBool>) {
        let free = self
            .buffers
            .iter()
            .find(|(b, f)| b.size() == bytes && f.load(Ordering::Acquire));
        if let Some((b, f)) = free {
            f.store(false, Ordering::Release);
            return (b.clone(), f.clone());
        }
        let buffer = ctx.create_buffer(&wgpu::BufferDescriptor {
            label: Some("logits read-back"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let flag = Arc::new(AtomicBool::new(false));
        if self.buffers.len() == POOL_SIZE {
            self.buffers.remove(0);
        }
        self.buffers.push((buffer.clone(), flag.clone()));
        (buffer, flag)
    }
}

/// A step's logits on their way back from the GPU. `.await` it, or [`PendingLogits::wait`].
#[must_use = "the logits are only read by awaiting or waiting"]
pub struct PendingLogits {
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    device: wgpu::Device,
    staging: wgpu::Buffer,
    n: usize,
    softcap: Option<f32>,
    state: Arc<(Mutex<MapState>, Condvar)>,
    /// Set once the logits are read and the buffer unmapped (the pool may reuse it).
    free: Arc<AtomicBool>,
}

impl PendingLogits {
    /// Starts mapping `staging` (its first `n` f32 are the logits) once the submitted work is
    /// done; `softcap` is applied when they are read, and then `free` is set.
    pub(super) fn new(
        device: &wgpu::Device,
        (staging, free): (wgpu::Buffer, Arc<AtomicBool>),
        n: usize,
        softcap: Option<f32>,
    ) -> PendingLogits {
        let state = Arc::new((Mutex::new(MapState::default()), Condvar::new()));
        let report = state.clone();
        staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let mut s = report.0.lock().unwrap_or_else(|e| e.into_inner());
            s.done = Some(r);
            report.1.notify_all();
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        });
        PendingLogits {
            device: device.clone(),
            staging,
            n,
            softcap,
            state,
            free,
        }
    }

    /// Blocks until the GPU is done and returns the logits (native: polls the device).
    ///
    /// Errors: [`Error::Gpu`] when the device is lost or the buffer cannot be mapped.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait(mut self) -> Result<Vec<f32>> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu(format!("waiting for the GPU: {e}")))?;
        // Another thread's poll may be running the callback right now: wait for it.
        {
            let (lock, cvar) = &*self.state;
            let s = lock.lock().unwrap_or_else(|e| e.into_inner());
            let timeout = std::time::Duration::from_secs(60);
            drop(
                cvar.wait_timeout_while(s, timeout, |s| s.done.is_none())
                    .unwrap_or_else(|e| e.into_inner()),
            );
        }
        match Pin::new(&mut self).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(Error::Gpu(
                "the GPU finished but the logits were not mapped".into(),
            )),
        }
    }

    /// Reads the mapped logits.
    fn read(&self) -> Result<Vec<f32>> {
        let slice = self.staging.slice(..);
        let data = slice
            .get_mapped_range()
            .map_err(|e| Error::Gpu(format!("cannot read the logits: {e}")))?;
        let mut out = bytemuck::cast_slice::<u8, f32>(&data)[..self.n].to_vec();
        drop(data);
        self.staging.unmap();
        self.free.store(true, Ordering::Release);
        if let Some(cap) = self.softcap {
            out.iter_mut().for_each(|l| *l = (*l / cap).tanh() * cap);
        }
        Ok(out)
    }
}

impl Future for PendingLogits {
    type Output = Result<Vec<f32>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let done = {
            let mut s = self.state.0.lock().unwrap_or_else(|e| e.into_inner());
            match s.done.take() {
                None => {
                    s.waker = Some(cx.waker().clone());
                    return Poll::Pending;
                }
                Some(d) => d,
            }
        };
        Poll::Ready(match done {
            Ok(()) => self.read(),
            Err(e) => Err(Error::Gpu(format!("cannot map the logits: {e}"))),
        })
    }
}
