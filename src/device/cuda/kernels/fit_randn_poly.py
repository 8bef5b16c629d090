"""Derives the polynomial coefficients of gpumem's randn (src/device/cuda/kernels/randn.cu and its
CPU twin src/tensor/philox.rs): -2 ln(1+f)/f (degree 8), sin(pi x/2)/x (degree 7 in x) and
cos(pi x/2) (degree 6 in x, constant term fixed to 1).

Near-minimax fits of relative error (Lawson's iteratively reweighted least squares on 4000
Chebyshev points), then each coefficient is rounded to float32, lowest order first, and the
remaining ones refitted. Prints each polynomial's max relative error with the float32
coefficients (evaluated in float64) and the coefficients, highest order last.

    pip install numpy mpmath && python3 src/device/cuda/kernels/fit_randn_poly.py
"""
import mpmath as mp
import numpy as np

mp.mp.dps = 40
POINTS = 4000


def fit(fn, a, b, n, fixed=()):
    x = np.cos(np.linspace(0, np.pi, POINTS)) * (b - a) / 2 + (a + b) / 2
    y = np.array([float(fn(mp.mpf(float(t)))) for t in x])
    fixed = list(fixed)
    while len(fixed) < n:
        k = len(fixed)
        base = sum(c * x**i for i, c in enumerate(fixed)) if fixed else 0 * x
        v = np.vstack([x**i for i in range(k, n)]).T / y[:, None]
        target = 1 - base / y
        w = np.ones(POINTS) / POINTS
        for _ in range(300):
            c, *_ = np.linalg.lstsq(v * np.sqrt(w)[:, None], target * np.sqrt(w), rcond=None)
            e = np.abs(v @ c - target)
            w = w * (e + 1e-30)
            w /= w.sum()
        fixed.append(float(np.float32(c[0])))
    xs = np.linspace(a, b, 40001)
    ys = np.array([float(fn(mp.mpf(float(t)))) for t in xs])
    p = sum(c * xs**i for i, c in enumerate(fixed))
    return fixed, np.max(np.abs(p / ys - 1))


def main():
    lo, hi = float(mp.sqrt(0.5)) - 1, float(mp.sqrt(2)) - 1
    # P(f) ~ -2 ln(1+f)/f, f = m - 1 with m in [sqrt(1/2), sqrt(2)); P(0) = -2 exactly.
    log = lambda f: -2 * mp.log1p(f) / f if f != 0 else mp.mpf(-2)
    # S(x)/x = sin(pi x/2)/x and C(x) = cos(pi x/2) in t = x^2, x in [-1/2, 1/2].
    sin = lambda t: (mp.sin(mp.pi * mp.sqrt(t) / 2) / mp.sqrt(t) if t != 0 else mp.pi / 2)
    cos = lambda t: mp.cos(mp.pi * mp.sqrt(t) / 2)
    for name, fn, a, b, n, fixed in [("log", log, lo, hi, 9, [-2.0]), ("sin", sin, 0, 0.25, 4, []),
                                     ("cos", cos, 0, 0.25, 4, [1.0])]:
        coefficients, error = fit(fn, a, b, n, fixed)
        print(f"{name}: max relative error {error:.3g}")
        for c in coefficients:
            print(f"    {c:.9e}")
    c = -2 * mp.log(2)
    c_hi = np.float32(float(c))
    print(f"-2 ln 2 = {c_hi:.9e} (float32), relative error {float((mp.mpf(float(c_hi)) - c) / c):.2g}")


if __name__ == "__main__":
    main()
