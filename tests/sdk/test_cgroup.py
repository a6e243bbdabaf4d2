"""Reading a cgroup's cpu.stat, v1 and v2 layouts (files written as the kernel writes them)."""

from otel_train.sources import cgroup


def test_v2_unified_cpu_stat(tmp_path):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "cpu.stat").write_text(
        "usage_usec 100\nuser_usec 60\nsystem_usec 40\nnr_periods 10\nnr_throttled 3\n"
        "throttled_usec 2500000\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text("0::/job\n")
    path = cgroup.cpu_stat_path(tmp_path, proc)
    assert path == tmp_path / "job" / "cpu.stat"
    assert cgroup.throttled_seconds(path) == 2.5


def test_v1_cpu_controller_cpu_stat(tmp_path):
    (tmp_path / "cpu,cpuacct" / "kubepods").mkdir(parents=True)
    (tmp_path / "cpu,cpuacct" / "kubepods" / "cpu.stat").write_text(
        "nr_periods 10\nnr_throttled 2\nthrottled_time 1500000000\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text("9:pids:/kubepods\n4:cpu,cpuacct:/kubepods\n")
    path = cgroup.cpu_stat_path(tmp_path, proc)
    assert cgroup.throttled_seconds(path) == 1.5


def test_no_cpu_stat_is_none(tmp_path):
    proc = tmp_path / "proc-cgroup"
    proc.write_text("0::/\n")
    assert cgroup.cpu_stat_path(tmp_path, proc) is None
