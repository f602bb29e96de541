//! Scenario tests of the mirrored metadata copies (format 2) on memory
//! devices behind the fault-injecting device: what the array says and
//! does when one device's copy cannot be written.

use super::*;

#[test]
fn a_copy_that_cannot_be_written_fails_its_device_and_the_warning_names_the_copy() {
    let dir = tempfile::tempdir().unwrap();
    let (k, m, unit) = (4u32, 2u32, 4096u32);
    let mut opts = options(6, k, m, unit, 16 * k as u64 * unit as u64);
    opts.metadata = MetadataPlacement::Devices;
    opts.journal_bytes_max = 1 << 20;
    let geo = geometry_for(&opts).unwrap();
    let mems: Vec<MemDevice> = (0..6)
        .map(|i| MemDevice::new(&format!("d{i}"), geo.device_bytes_min()))
        .collect();
    let plans: Vec<Arc<FaultPlan>> = (0..6).map(|_| FaultPlan::new()).collect();
    let devs = mems
        .iter()
        .map(|d| Arc::new(d.clone()) as Arc<dyn Device>)
        .collect();
    format(dir.path(), &opts, devs).unwrap();
    let devices = mems
        .iter()
        .zip(&plans)
        .map(
            |(d, p)| Some(Arc::new(FaultyDevice::new(d.clone(), Arc::clone(p))) as Arc<dyn Device>),
        )
        .collect();
    let array = Array::open_with_devices(dir.path(), devices, None).unwrap();
    // Device 4's metadata area refuses writes; its data area does not.
    let area = geo.meta_area_offset();
    *plans[4].bad_write_range.lock().unwrap() = Some((area, area + geo.meta_area_bytes));
    array.write(&vec![7u8; 8192], 0, false).unwrap();
    assert_eq!(
        array.member_states()[4],
        MemberState::Active,
        "not failed before the flush that fails it"
    );
    array.flush().unwrap();
    assert_eq!(array.member_states()[4], MemberState::Failed);
    let warnings = array.warnings().join("\n");
    assert!(
        warnings.contains("device 4 failed (metadata area: writing its copy of intent.map"),
        "the warning names the copy that failed and that the device is failed: {warnings}"
    );
    let mut back = vec![0u8; 8192];
    array.read(&mut back, 0).unwrap();
    assert!(back.iter().all(|&b| b == 7));
}
