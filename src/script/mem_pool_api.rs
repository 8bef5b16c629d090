//! Private memory pools named as in `torch.cuda`: `mem_pool()` is `torch.cuda.MemPool()`,
//! `use_mem_pool(pool, || ...)` is `with torch.cuda.use_mem_pool(pool): ...`, and a pool has
//! PyTorch's `pool.id` and `pool.use_count()`. Thin glue over [`crate::tensor::mem_pool`].

use std::rc::Rc;

use rhai::{Array, Dynamic, Engine, FnPtr, NativeCallContext, INT};

use super::args::{fail, BindingResult};
use crate::tensor::mem_pool::MemPool;
use crate::tensor::Devices;

/// `use_mem_pool(pool, closure)`: calls `closure` with every allocation of the pool's device
/// going to the pool, and returns its value.
fn use_mem_pool(
    context: &NativeCallContext,
    pool: &Dynamic,
    closure: &Dynamic,
) -> BindingResult<Dynamic> {
    const NAME: &str = "use_mem_pool";
    let Some(pool) = pool.read_lock::<MemPool>().map(|pool| pool.clone()) else {
        return fail(
            NAME,
            format!(
                "the first argument must be a pool made by mem_pool(), got {}",
                pool.type_name()
            ),
        );
    };
    let Some(closure) = closure.read_lock::<FnPtr>().map(|f| f.clone()) else {
        return fail(
            NAME,
            format!(
                "the second argument must be a function, as in || {{ ... }}, got {}",
                closure.type_name()
            ),
        );
    };
    match pool.routing(|| closure.call_within_context::<Dynamic>(context, ())) {
        Ok(result) => result,
        Err(error) => fail(NAME, error),
    }
}

/// Registers `mem_pool`, `use_mem_pool` and the pool's `id` and `use_count()`.
pub fn register(engine: &mut Engine, devices: &Rc<Devices>) {
    engine
        .register_type_with_name::<MemPool>("MemPool")
        .register_fn("to_string", |pool: &mut MemPool| pool.to_string())
        .register_fn("to_debug", |pool: &mut MemPool| pool.to_string())
        .register_get("id", |pool: &mut MemPool| -> Array {
            let (first, second) = pool.id().pair();
            vec![Dynamic::from(first as INT), Dynamic::from(second as INT)]
        })
        .register_fn("use_count", |pool: &mut MemPool| -> BindingResult<INT> {
            match pool.use_count() {
                Ok(count) => Ok(INT::from(count)),
                Err(error) => fail("use_count", error),
            }
        });
    let on = Rc::clone(devices);
    engine.register_fn("mem_pool", move || -> BindingResult<MemPool> {
        MemPool::new(&on.current()).or_else(|error| fail("mem_pool", error))
    });
    engine.register_fn(
        "use_mem_pool",
        |context: NativeCallContext, pool: Dynamic, closure: Dynamic| {
            use_mem_pool(&context, &pool, &closure)
        },
    );
}
