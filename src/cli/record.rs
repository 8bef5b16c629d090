//! Recording a script's timelines for `gpumem run --timeline/--report`: one recorder on each
//! device's allocator, and one on every allocator the script makes current with
//! `with_allocator_conf` (subscribed through that device runtime's [`SessionWatcher`] before
//! the allocator's first event), each drawn as its own labelled timeline with its own counters.
//! The script's `mark(text)` phases go to every timeline being recorded at that moment.

use std::cell::RefCell;
use std::rc::Rc;

use gpumem::alloc::summary::memory_summary;
use gpumem::alloc::{CachingAllocator, Subscription};
use gpumem::script::{history, viz_api};
use gpumem::tensor::{Devices, Runtime, SessionWatcher};
use gpumem::viz::{Recorder, Timeline};

use super::Drawn;

/// An allocator a `with_allocator_conf` made current, and what it ended with.
struct Side {
    recorder: Rc<RefCell<Recorder>>,
    /// Its config, in PyTorch's syntax.
    config: String,
    /// The script line that made it (a trace context).
    context: u32,
    /// Counters and summary when its closure ended.
    end: Option<(Vec<(String, i64)>, String)>,
}

/// What the watcher and the recording share.
struct Shared {
    title: String,
    main: Rc<RefCell<Recorder>>,
    sides: Vec<Side>,
    /// Sides whose closures are running, innermost last.
    active: Vec<usize>,
}

/// The runtime's watcher: subscribes a recorder to each allocator made current.
struct Watcher(Rc<RefCell<Shared>>);

impl SessionWatcher for Watcher {
    fn allocator_started(&mut self, allocator: &mut CachingAllocator) {
        let mut shared = self.0.borrow_mut();
        let recorder = Rc::new(RefCell::new(Recorder::new(allocator, shared.title.clone())));
        // The subscription lives as long as the allocator: frees of tensors that outlive the
        // closure are still drawn.
        allocator.subscribe(Box::new(Rc::clone(&recorder)));
        shared.sides.push(Side {
            recorder,
            config: allocator.config().source.clone(),
            context: allocator.trace_context(),
            end: None,
        });
        let index = shared.sides.len() - 1;
        shared.active.push(index);
    }

    fn allocator_ended(&mut self, allocator: &CachingAllocator) {
        let mut shared = self.0.borrow_mut();
        if let Some(index) = shared.active.pop() {
            shared.sides[index].end = Some((
                allocator.stats().entries(),
                memory_summary(allocator.stats(), allocator.device().index(), false),
            ));
        }
    }

    fn mark(&mut self, text: &str, context: u32) {
        let shared = self.0.borrow();
        shared.main.borrow_mut().mark(text, context);
        for &index in &shared.active {
            shared.sides[index]
                .recorder
                .borrow_mut()
                .mark(text, context);
        }
    }
}

/// One device being recorded.
struct DeviceRecording {
    runtime: Rc<Runtime>,
    subscription: Subscription,
    shared: Rc<RefCell<Shared>>,
}

/// A script being recorded, device by device.
pub(crate) struct Recording {
    devices: Vec<DeviceRecording>,
}

impl Recording {
    /// Starts recording every device's allocator, and every allocator each makes current, for
    /// a script titled `title`. While recorded, bindings stamp their script line on the
    /// allocator's trace context.
    pub(crate) fn start(devices: &Devices, title: &str) -> Recording {
        let devices = devices
            .all()
            .into_iter()
            .map(|runtime| {
                let main = Rc::new(RefCell::new(Recorder::new(&runtime.allocator(), title)));
                let subscription = runtime.subscribe(Box::new(Rc::clone(&main)));
                let shared = Rc::new(RefCell::new(Shared {
                    title: title.to_string(),
                    main,
                    sides: Vec::new(),
                    active: Vec::new(),
                }));
                runtime.watch(Some(Box::new(Watcher(Rc::clone(&shared)))));
                DeviceRecording {
                    runtime,
                    subscription,
                    shared,
                }
            })
            .collect();
        Recording { devices }
    }

    /// The devices recorded, as a report's subtitle names them (`sim`, `sim:0, sim:1`).
    pub(crate) fn devices_label(&self) -> String {
        let labels: Vec<&str> = self
            .devices
            .iter()
            .map(|device| device.runtime.device_label())
            .collect();
        labels.join(", ")
    }

    /// Stops recording; the timelines, device by device (each device's allocator under
    /// `config`, then the allocators its script made current), each with its labels and end
    /// state.
    pub(crate) fn finish(self, config: &str) -> Vec<Drawn> {
        let several = self.devices.len() > 1;
        let mut drawn = Vec::new();
        for (index, device) in self.devices.into_iter().enumerate() {
            let label = if several {
                format!("device {index} ({})", device.runtime.device_label())
            } else {
                format!("session allocator ({})", device.runtime.device_label())
            };
            drawn.extend(device.finish(label, config));
        }
        drawn
    }
}

impl DeviceRecording {
    /// Stops recording this device: its allocator's timeline labelled `label`, then its side
    /// allocators'.
    fn finish(self, label: String, config: &str) -> Vec<Drawn> {
        self.runtime.unsubscribe(self.subscription);
        self.runtime.watch(None);
        let shared = self.shared.borrow();
        let labelled = |recorder: &Rc<RefCell<Recorder>>| -> Timeline {
            let mut timeline = recorder.borrow().timeline(Vec::new());
            timeline.labels = viz_api::timeline_labels(&timeline);
            timeline
        };
        let allocator = self.runtime.allocator();
        let mut drawn = vec![Drawn {
            label: label.clone(),
            timeline: labelled(&shared.main),
            config: config.to_string(),
            counters: allocator.stats().entries(),
            summary: memory_summary(allocator.stats(), allocator.device().index(), false),
        }];
        for (number, side) in shared.sides.iter().enumerate() {
            let site = history::frames(side.context)
                .last()
                .map(|frame| {
                    let file = frame.filename.rsplit('/').next().unwrap_or(&frame.filename);
                    format!(" at {file}:{}", frame.line)
                })
                .unwrap_or_default();
            let (counters, summary) = side.end.clone().unwrap_or_default();
            let prefix = if label.starts_with("device ") {
                format!("{label}: ")
            } else {
                String::new()
            };
            drawn.push(Drawn {
                label: format!(
                    "{prefix}with_allocator_conf(\"{}\") #{}{site}",
                    side.config,
                    number + 1
                ),
                timeline: labelled(&side.recorder),
                config: side.config.clone(),
                counters,
                summary,
            });
        }
        drawn
    }
}
