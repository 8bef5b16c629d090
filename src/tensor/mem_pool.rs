//! `torch.cuda.MemPool` and `torch.cuda.use_mem_pool` for scripts: a private pool of one
//! device's allocator ([`crate::alloc::MemPoolId`] `(0, n)`), which tensors made inside
//! [`MemPool::routing`] take their blocks from. Like PyTorch's, the pool is created with one
//! use; routing adds a use for its span; and when the last reference to the pool goes, it
//! loses its use and its wholly free segments go back to the device (`~MemPool`:
//! `releasePool`, then `emptyCache(id)`). Tensors still alive in it keep its segments until
//! they are freed and the cache is emptied.

use std::fmt;
use std::rc::Rc;

use crate::alloc::{AllocError, MemPoolId, PoolFilter};

use super::Runtime;

/// A private pool of one device's allocator, shared by every copy of the handle; the pool
/// loses the handle's use when the last copy is dropped.
#[derive(Clone)]
pub struct MemPool {
    inner: Rc<PoolUse>,
}

/// The use a [`MemPool`] holds on its pool.
struct PoolUse {
    runtime: Rc<Runtime>,
    /// The [`CachingAllocator::id`] of the allocator the pool belongs to.
    owner: u64,
    id: MemPoolId,
}

impl MemPool {
    /// A new pool in the current allocator of `runtime`, with one use (`torch.cuda.MemPool()`).
    pub fn new(runtime: &Rc<Runtime>) -> Result<MemPool, AllocError> {
        let (owner, id) = runtime.with_allocator(|allocator| {
            let id = allocator.new_mem_pool_id();
            allocator.create_pool(id).map(|()| (allocator.id(), id))
        })?;
        Ok(MemPool {
            inner: Rc::new(PoolUse {
                runtime: Rc::clone(runtime),
                owner,
                id,
            }),
        })
    }

    /// The pool's id, as PyTorch's `MemPool.id`.
    pub fn id(&self) -> MemPoolId {
        self.inner.id
    }

    /// The pool's uses (`MemPool.use_count()`): 1 for the handle, one more while
    /// [`MemPool::routing`] runs, more for graphs sharing it.
    pub fn use_count(&self) -> Result<u32, AllocError> {
        let id = self.inner.id;
        let count = self
            .inner
            .runtime
            .with_owner_allocator(self.inner.owner, |allocator| allocator.pool_use_count(id))
            .map_err(AllocError::Pool)?;
        count.flatten().ok_or_else(|| {
            AllocError::Pool(format!(
                "pool {id} is gone with the allocator it was made in (with_allocator_conf)"
            ))
        })
    }

    /// Runs `body` with every allocation of the pool's device, on every stream, going to the
    /// pool (`with torch.cuda.use_mem_pool(pool): ...`): the pool gains a use at the start
    /// (`beginAllocateToPool`), and at the end — even when `body` fails — stops taking
    /// allocations and loses that use (`endAllocateToPool`, `releasePool`). Refused when the
    /// pool is already taking allocations, and when another allocator is current (inside
    /// `with_allocator_conf`): the pool belongs to the allocator it was made in.
    pub fn routing<R>(&self, body: impl FnOnce() -> R) -> Result<R, AllocError> {
        let id = self.inner.id;
        let runtime = &self.inner.runtime;
        let current = runtime.allocator().id();
        if current != self.inner.owner {
            return Err(AllocError::Pool(format!(
                "pool {id} belongs to another allocator than the current one (made outside with_allocator_conf, or inside another)"
            )));
        }
        runtime.with_allocator(|allocator| {
            allocator.begin_allocate_to_pool(id, PoolFilter::AllStreams)
        })?;
        let result = body();
        runtime.with_allocator(|allocator| {
            allocator
                .end_allocate_to_pool(id)
                .and_then(|()| allocator.release_pool(id))
        })?;
        Ok(result)
    }
}

impl fmt::Display for MemPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (first, second) = self.inner.id.pair();
        write!(f, "MemPool(id=({first}, {second}))")
    }
}

impl Drop for PoolUse {
    fn drop(&mut self) {
        let id = self.id;
        let outcome = self.runtime.with_owner_allocator(self.owner, |allocator| {
            allocator
                .release_pool(id)
                .and_then(|()| allocator.empty_cache_pool(id))
        });
        // A pool is dropped only from script code, never while the allocator is borrowed; if
        // that ever happened the pool would keep its use, which memory_map() would show.
        // An allocator already gone (made inside with_allocator_conf, nothing left in it)
        // took the pool with it.
        match outcome {
            Ok(None | Some(Ok(()))) => {}
            Ok(Some(Err(error))) => {
                eprintln!("gpumem: internal error releasing pool {id}: {error}")
            }
            Err(error) => eprintln!("gpumem: internal error releasing pool {id}: {error}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{AllocConf, MIB};
    use crate::device::sim::SimDevice;
    use crate::tensor::{DType, Tensor};

    fn runtime() -> Rc<Runtime> {
        Runtime::sim(SimDevice::new(8 << 30), AllocConf::default()).expect("runtime")
    }

    fn reserved(runtime: &Runtime) -> i64 {
        runtime.allocator().stats().reserved_bytes.all.current
    }

    #[test]
    fn tensors_made_while_routing_live_in_the_pool_until_it_goes() {
        let runtime = runtime();
        let pool = MemPool::new(&runtime).expect("pool");
        assert_eq!(pool.id(), MemPoolId::new(0, 1));
        assert_eq!(pool.use_count().expect("count"), 1);
        let kept = pool
            .routing(|| {
                assert_eq!(pool.use_count().expect("count"), 2);
                Tensor::empty(&runtime, &[4 * MIB as usize], DType::UInt8).expect("tensor")
            })
            .expect("routing");
        assert_eq!(pool.use_count().expect("count"), 1);
        let pools = runtime.allocator().private_pools();
        assert_eq!(pools.len(), 1);
        assert_eq!(pools[0].allocated_bytes, 4 * MIB);
        let copy = pool.clone();
        drop(pool);
        assert_eq!(copy.use_count().expect("count"), 1, "a copy keeps the use");
        drop(copy);
        assert_eq!(
            reserved(&runtime),
            20 * MIB as i64,
            "the tensor keeps its segment"
        );
        drop(kept);
        runtime.empty_cache().expect("empty");
        assert_eq!(reserved(&runtime), 0);
        assert!(runtime.allocator().private_pools().is_empty());
    }

    #[test]
    fn a_pool_is_refused_by_another_allocator_and_twice_at_once() {
        let runtime = runtime();
        let pool = MemPool::new(&runtime).expect("pool");
        let other = runtime
            .fresh_allocator(AllocConf::default())
            .expect("allocator");
        let refused = runtime.with_allocator_swapped(other, || pool.routing(|| ()));
        assert!(
            matches!(refused, Err(AllocError::Pool(ref text)) if text.contains("another allocator")),
            "{refused:?}"
        );
        let nested = pool.routing(|| pool.routing(|| ())).expect("outer routing");
        assert!(matches!(nested, Err(AllocError::Pool(_))), "{nested:?}");
        assert_eq!(pool.use_count().expect("count"), 1);
        assert!(runtime.allocator().active_pools().is_empty());
    }
}
