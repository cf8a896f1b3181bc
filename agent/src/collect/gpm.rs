//! GPM samples kept from one collection to the next.
//!
//! GPM metrics are computed between two samples of a GPU's counters (`nvmlGpmSampleGet`).
//! nvml-wrapper 0.13 only offers [`Device::gpm_sample`], which allocates a new sample
//! (`nvmlGpmSampleAlloc`) at every call and frees it when dropped: 0.18 ms per call on an H100
//! under load, against 0.04 ms for `nvmlGpmSampleGet` into a sample that already exists.
//! [`GpmPair`] therefore holds two samples per GPU, allocated once through nvml-wrapper (and
//! freed by it when the pair is dropped), and refills the older one at each collection with
//! `nvmlGpmSampleGet` ([`refill`], the only `unsafe` code of the agent).

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::gpm::GpmSample;

/// The two most recent GPM samples of one GPU.
#[derive(Debug, Default)]
pub struct GpmPair {
    /// Allocated samples (at most two); `latest` indexes the newest valid one.
    samples: Vec<GpmSample<'static>>,
    latest: usize,
}

impl GpmPair {
    /// An empty pair: the first [`GpmPair::sample`] allocates.
    pub fn new() -> Self {
        Self::default()
    }

    /// Take a sample of `device` now. Returns the previous sample and this one, or `None` on
    /// the first call (there is nothing to compare with yet). On an error the previous sample
    /// is kept, so the next success is compared with it.
    pub fn sample(
        &mut self,
        device: &Device<'static>,
    ) -> Result<Option<(&GpmSample<'static>, &GpmSample<'static>)>, NvmlError> {
        match self.samples.len() {
            0 => {
                self.samples.push(device.gpm_sample()?);
                self.latest = 0;
                Ok(None)
            }
            1 => {
                self.samples.push(device.gpm_sample()?);
                self.latest = 1;
                Ok(Some((&self.samples[0], &self.samples[1])))
            }
            _ => {
                let older = 1 - self.latest;
                refill(device, &self.samples[older])?;
                self.latest = older;
                Ok(Some((&self.samples[1 - older], &self.samples[older])))
            }
        }
    }
}

/// Fill `sample` with the GPM counters of `device` now (`nvmlGpmSampleGet`), reusing its
/// memory instead of allocating a new sample as [`Device::gpm_sample`] does.
#[allow(unsafe_code)]
pub fn refill(device: &Device<'static>, sample: &GpmSample<'static>) -> Result<(), NvmlError> {
    let nvml = device.nvml();
    // Both must come from the same loaded library for the handles to mean anything to it.
    if !std::ptr::eq(nvml, sample.nvml()) {
        return Err(NvmlError::InvalidArg);
    }
    let sym = nvml_sym(nvml.lib().nvmlGpmSampleGet.as_ref())?;
    // SAFETY: `sym` is `nvmlGpmSampleGet` of the library that `device` and `sample` were
    // obtained from (checked above), which stays loaded for 'static. The device handle is a
    // valid handle of that library (a stale one makes NVML answer an error, not misbehave).
    // The sample handle was allocated by `nvmlGpmSampleAlloc` through nvml-wrapper, is owned
    // by the `GpmSample` we borrow (so it is not freed during the call, and only its `Drop`
    // frees it, once), and is used by this thread only: `GpmSample` is not `Sync`, and the
    // pair that holds it is reached through `&mut`. The call only writes into the sample.
    let code = unsafe { sym(device.handle(), sample.handle()) };
    nvml_try(code)
}
