//! The kernels' thread pool.
//!
//! wasm32-unknown-unknown has no threads: rayon cannot spawn workers there, so the pool is the
//! calling thread itself (`use_current_thread`), built once and shared by every engine (a thread
//! can belong to one pool only). Natively (tests) it is an ordinary pool of one worker, so that
//! the native and browser runs split work the same way.

use std::sync::Arc;

use hotcold_core::Result;
use rayon::ThreadPool;

/// The pool every [`crate::Runner`] evaluates on.
#[cfg(target_arch = "wasm32")]
pub fn shared_pool() -> Result<Arc<ThreadPool>> {
    use std::sync::OnceLock;
    static POOL: OnceLock<Arc<ThreadPool>> = OnceLock::new();
    if let Some(pool) = POOL.get() {
        return Ok(pool.clone());
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .use_current_thread()
        .build()
        .map(Arc::new)
        .map_err(|e| {
            hotcold_core::Error::InvalidArgument(format!("cannot set up the wasm thread pool: {e}"))
        })?;
    Ok(POOL.get_or_init(|| pool).clone())
}

/// The pool every [`crate::Runner`] evaluates on.
#[cfg(not(target_arch = "wasm32"))]
pub fn shared_pool() -> Result<Arc<ThreadPool>> {
    hotcold_core::engine::thread_pool(1)
}
