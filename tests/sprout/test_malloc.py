"""`sprout.keep_freed_memory()` keeps freed memory for reuse, so repeated activation caches do not page-fault
their memory in anew; `import sprout` alone leaves the allocator as it was."""
import subprocess
import sys

import pytest

# d_ff 5120 makes each MLP activation 40 MiB: above glibc's largest dynamic mmap threshold (32 MiB), so
# without keep_freed_memory() every cache maps them anew, and below the 64 MiB it sets, so with it they are reused.
SCRIPT = """
import resource, torch
import sys, sprout
if sys.argv[1] == 'keep':
    assert sprout.keep_freed_memory()
torch.set_num_threads(1)
model = sprout.Sprout(sprout.SproutConfig(vocab_size=512, context=256, n_layer=2, n_head=4, d_model=128, d_ff=5120))
tokens = torch.randint(0, 512, (8, 256))
with torch.inference_mode():
    for _ in range(2):
        _, cache = model.run_with_cache(tokens); del cache
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        _, cache = model.run_with_cache(tokens); pages = sum(t.numel() * t.element_size() for t in cache.values()) // 4096; del cache
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, pages)
"""


def start(keep: bool) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SCRIPT, "keep" if keep else "import-only"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def page_faults(proc: subprocess.Popen) -> tuple[int, int]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    faults, pages = out.split()
    return int(faults), int(pages)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator settings are Linux-only")
def test_repeated_caches_reuse_memory_instead_of_page_faulting():
    # The kernel may reclaim idle pages at any moment (this machine runs DAMON's kdamond), which adds
    # faults that no allocator setting prevents: the fewest of three runs measures the allocator.
    # The first run of each kind side by side (page faults are counted per process); the retries alone.
    first, import_only = start(keep=True), start(keep=False)
    runs = [page_faults(first)]
    while len(runs) < 3 and runs[-1][0] >= runs[-1][1] // 4:
        runs.append(page_faults(start(keep=True)))
    faults, pages = min(runs)
    # Three caches of `pages` pages each, served from memory already mapped. A run faults in either almost
    # nothing or about one 40 MiB buffer (measured: 1, 7,938 and 9,217 faults for 78,858 pages), so the bound
    # is a quarter of one cache: far below the three caches' worth that the default allocator faults in.
    assert faults < pages // 4
    faults_import_only, _ = page_faults(import_only)
    assert faults_import_only > 2 * pages  # import alone keeps glibc's thresholds: nearly every cache page is new
    assert faults_import_only > 10 * faults
