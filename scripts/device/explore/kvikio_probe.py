import time, os
import kvikio, kvikio.defaults
print("kvikio", kvikio.__version__)
try: print("compat mode", kvikio.defaults.compat_mode())
except Exception as e: print("compat err", repr(e))
try:
    import kvikio.cufile_driver as d
    print("driver props", d.DriverProperties().is_gds_available if hasattr(d, "DriverProperties") else "?")
except Exception as e: print("driver err", repr(e))
import cupy
a = cupy.arange(64 * 2**20 // 4, dtype=cupy.float32)
f = kvikio.CuFile("/tmp/kv.bin", "w"); t = time.perf_counter(); f.write(a); f.close(); print("write 64MiB %.3f s" % (time.perf_counter() - t))
b = cupy.empty_like(a); f = kvikio.CuFile("/tmp/kv.bin", "r"); t = time.perf_counter(); f.read(b); f.close(); print("read 64MiB %.3f s" % (time.perf_counter() - t), bool((a == b).all()))
os.unlink("/tmp/kv.bin")
