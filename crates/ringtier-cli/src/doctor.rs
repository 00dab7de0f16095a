//! `ringtier doctor [PATH ...] [--json]`: prints the report of `ringtier::doctor` (one line
//! per finding, then the verdict; or JSON). It is a report: it exits 0 whatever it finds.

use crate::args::DoctorArgs;

/// Runs the doctor on the given paths (the current and the temp directory where none) and
/// prints its report on stdout.
pub(crate) fn command(a: DoctorArgs) {
    let report = ringtier::doctor::run(&a.paths);
    if a.json {
        println!("{}", report.to_json());
    } else {
        print!("{report}");
    }
}
