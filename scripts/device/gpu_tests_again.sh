#!/usr/bin/env bash
# On a lent GPU machine (2026-12-06, eighteenth session): the slow tests that failed beside the
# GPU in slow_1206.sh, and the fast-subset test that failed in regress_1206.sh, again after the
# fixes (75eed97, a8f9aa9 and the tests commit after them); then every gpu-marked test.
#   bash scripts/device/gpu_tests_again.sh   # carry: .whl/, .carry/testwhl/
. "$(dirname "$0")/setup.sh"
DIR="$OUT/again"; mkdir -p "$DIR"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/tsite \
  .carry/testwhl/*.whl 2>/dev/null && export PYTHONPATH="$PYTHONPATH:/tmp/tsite"
export PATH="/tmp/site/bin:/tmp/tsite/bin:$PATH"
tests=(
  tests/test_storage_probe.py
  tests/test_readme.py::test_the_cpu_smoke_runs_pass_from_a_fresh_clone
  tests/test_storage_gpu.py::test_storage_with_a_gpu_on_cpu_torch_measures_the_host_and_says_what_it_skipped
  tests/test_probe_worker.py::test_stdin_with_cleared_environment
  tests/test_scheduler.py::test_container_launcher_delivers_the_worker_on_stdin
  "tests/test_watch_jobs_script.py::test_each_framework_job_runs_with_and_without_its_defect"
  tests/test_watch_jobs_script.py::test_jobs_alone_and_watched_on_cpu_with_a_failing_job
  tests/test_watch_ranks.py
  tests/test_watch_command.py::test_text_report_names_the_cause_its_evidence_and_what_to_try
)
start=$SECONDS
timeout 200 python3 -m pytest -p no:cacheprovider -p no:benchmark -q -rs -n 8 -m "not gpu" "${tests[@]}" \
  > "$DIR/again.txt" 2>&1
echo "the failed ones and their files again: exit $? in $((SECONDS - start)) s: $(tail -1 "$DIR/again.txt")" | tee "$DIR/summary.txt"
start=$SECONDS
timeout 110 python3 -m pytest -p no:cacheprovider -p no:benchmark -q -m gpu tests > "$DIR/gpu.txt" 2>&1
echo "gpu-marked: exit $? in $((SECONDS - start)) s: $(tail -1 "$DIR/gpu.txt")" | tee -a "$DIR/summary.txt"
grep -h -E "^(FAILED|ERROR|SKIPPED)" "$DIR"/again.txt "$DIR"/gpu.txt | head -30
tar czf /tmp/again.tgz -C "$OUT" again && rm -rf "$DIR" && mv /tmp/again.tgz "$OUT/again.tgz"
