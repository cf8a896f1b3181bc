# Keeps GPU 0 busy with bf16 matrix products for argv[1] seconds and prints the rate it reached.
# Used by the scripts in tests/gpu/.
import sys, time, torch
secs = float(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + secs
n = 0
while time.time() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
    n += 20
print(f"matmul: {n} products of 8192^3 in {secs:.0f} s, {2*8192**3*n/secs/1e12:.0f} TFLOP/s", flush=True)
