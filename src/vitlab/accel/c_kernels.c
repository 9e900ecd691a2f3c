/* Fused element-wise passes of a ViT block's CPU training step (vitlab/accel/c_kernels.py).
 *
 * Each kernel does in one pass over the activations what ATen does in two or three: a
 * LayerNorm that also writes the next residual plus a bias, the MLP's bias + GELU, the GELU
 * backward that also sums the bias gradient, a LayerNorm backward that also adds the residual
 * gradient and sums the bias gradients of the layers around it. Row-major float32, rows of
 * length d (or n); rows are split over the OpenMP threads of the process (PyTorch's libgomp,
 * already loaded when this library is). Column sums are accumulated per thread in float over
 * RB rows, then in double. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

typedef long long i64;

/* Vector variants from glibc's libmvec (declared without -ffast-math, which would also set
   flush-to-zero for the whole process). */
__attribute__((__simd__("notinbranch"))) float expf(float);

#define RB 32

/* erf(z) given e = exp(-z*z): Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), the formula of
   ATen's vectorised erf. The GELU derivative needs the same exponential for its density. */
static inline __attribute__((always_inline)) float erf_given_exp(float z, float e) {
  float t = 1.f / (1.f + 0.3275911f * fabsf(z));
  float p = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  return copysignf(1.f - p * e, z);
}

/* Column sums per thread: `width` doubles each (zeroed, so the slots of threads that do not run
   add nothing) and `width` floats for the current RB rows. */
typedef struct {
  double *acc;
  float *fs;
  int nt;
} partials;

static void partials_free(partials *p) {
  free(p->acc);
  free(p->fs);
}

static int partials_new(partials *p, i64 width) { /* 0, or 1 when out of memory */
  p->nt = omp_get_max_threads();                  /* no parallel region below runs more threads */
  p->acc = calloc((size_t)p->nt * width, sizeof(double));
  p->fs = malloc(sizeof(float) * (size_t)p->nt * width);
  if (!p->acc || !p->fs) {
    partials_free(p);
    return 1;
  }
  return 0;
}

static float partials_sum(const partials *p, i64 width, i64 j) {
  double s = 0.0;
  for (int t = 0; t < p->nt; ++t) s += p->acc[(i64)t * width + j];
  return (float)s;
}

static void rows_of(i64 m, i64 *lo, i64 *hi) {
  int t = omp_get_thread_num(), nt = omp_get_num_threads();
  *lo = m * t / nt;
  *hi = m * (t + 1) / nt;
}

/* xn = LayerNorm(x) * w + b, with the row statistics; if rout: rout = x + rbias. */
void vl_layer_norm(const float *restrict x, const float *restrict w, const float *restrict b, float eps, i64 m, i64 d,
                   float *restrict xn, float *restrict mean, float *restrict rstd, const float *restrict rbias,
                   float *restrict rout) {
#pragma omp parallel for schedule(static)
  for (i64 i = 0; i < m; ++i) {
    const float *restrict xr = x + i * d;
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (i64 j = 0; j < d; ++j) s += xr[j];
    const float mu = s / (float)d;
    float v = 0.f;
#pragma omp simd reduction(+ : v)
    for (i64 j = 0; j < d; ++j) {
      float c = xr[j] - mu;
      v += c * c;
    }
    const float r = 1.f / sqrtf(v / (float)d + eps);
    float *restrict o = xn + i * d;
#pragma omp simd
    for (i64 j = 0; j < d; ++j) o[j] = (xr[j] - mu) * r * w[j] + b[j];
    mean[i] = mu;
    rstd[i] = r;
    if (rout) {
      float *restrict ro = rout + i * d;
#pragma omp simd
      for (i64 j = 0; j < d; ++j) ro[j] = xr[j] + rbias[j];
    }
  }
}

/* g = gelu(h + bias) (exact, erf); h is left as it is. */
void vl_bias_gelu(const float *restrict h, const float *restrict bias, i64 m, i64 n, float *restrict g) {
#pragma omp parallel for schedule(static)
  for (i64 i = 0; i < m; ++i) {
    const float *restrict hr = h + i * n;
    float *restrict gr = g + i * n;
#pragma omp simd
    for (i64 j = 0; j < n; ++j) {
      float v = hr[j] + bias[j];
      float z = v * 0.70710678118654752f;
      gr[j] = 0.5f * v * (1.f + erf_given_exp(z, expf(-z * z)));
    }
  }
}

/* dh = dg * gelu'(h + bias) (dh may be dg) and dbias = the column sums of dh. Returns 0, or 1
   when out of memory (nothing written). */
int vl_gelu_backward(const float *dg, const float *restrict h, const float *restrict bias, i64 m, i64 n, float *dh,
                     float *restrict dbias) {
  partials P;
  if (partials_new(&P, n)) return 1;
#pragma omp parallel
  {
    i64 lo, hi;
    rows_of(m, &lo, &hi);
    const int t = omp_get_thread_num();
    double *restrict acc = P.acc + (i64)t * n;
    float *restrict fs = P.fs + (i64)t * n;
    for (i64 i0 = lo; i0 < hi; i0 += RB) {
      const i64 i1 = i0 + RB < hi ? i0 + RB : hi;
      for (i64 j = 0; j < n; ++j) fs[j] = 0.f;
      for (i64 i = i0; i < i1; ++i) {
        const float *dgr = dg + i * n; /* dh may be dg: element j is read before it is written */
        const float *restrict hr = h + i * n;
        float *o = dh + i * n;
#pragma omp simd
        for (i64 j = 0; j < n; ++j) {
          float v = hr[j] + bias[j];
          float z = v * 0.70710678118654752f;
          float e = expf(-z * z);
          float cdf = 0.5f * (1.f + erf_given_exp(z, e));
          float r = dgr[j] * (cdf + v * 0.3989422804014327f * e);
          o[j] = r;
          fs[j] += r;
        }
      }
      for (i64 j = 0; j < n; ++j) acc[j] += fs[j];
    }
  }
  for (i64 j = 0; j < n; ++j) dbias[j] = partials_sum(&P, n, j);
  partials_free(&P);
  return 0;
}

/* The LayerNorm backward from the input x and its row statistics, plus a residual gradient:
   dx = resid + LN'(dxn) (resid may be NULL); dw, db: the affine gradients (each may be NULL);
   rsum, dxsum: the column sums of resid and of dx (each may be NULL). Returns 0, or 1 when out
   of memory (nothing written). */
int vl_layer_norm_backward(const float *restrict dxn, const float *restrict x, const float *restrict mean,
                           const float *restrict rstd, const float *restrict w, i64 m, i64 d, const float *restrict resid,
                           float *restrict dx, float *dw, float *db, float *rsum, float *dxsum) {
  partials P;
  if (partials_new(&P, 4 * d)) return 1;
#pragma omp parallel
  {
    i64 lo, hi;
    rows_of(m, &lo, &hi);
    const int t = omp_get_thread_num();
    double *restrict acc = P.acc + (i64)t * 4 * d;
    float *restrict fs = P.fs + (i64)t * 4 * d;
    float *restrict fw = fs, *restrict fb = fs + d, *restrict fr = fs + 2 * d, *restrict fx = fs + 3 * d;
    for (i64 i0 = lo; i0 < hi; i0 += RB) {
      const i64 i1 = i0 + RB < hi ? i0 + RB : hi;
      for (i64 j = 0; j < 4 * d; ++j) fs[j] = 0.f;
      for (i64 i = i0; i < i1; ++i) {
        const float *restrict g = dxn + i * d;
        const float *restrict xr = x + i * d;
        const float mu = mean[i], r = rstd[i];
        float a = 0.f, c = 0.f;
#pragma omp simd reduction(+ : a, c)
        for (i64 j = 0; j < d; ++j) {
          float xh = (xr[j] - mu) * r;
          float gw = g[j] * w[j];
          a += gw;
          c += gw * xh;
          fw[j] += g[j] * xh;
          fb[j] += g[j];
        }
        a /= (float)d;
        c /= (float)d;
        float *restrict o = dx + i * d;
        if (resid) {
          const float *restrict rr = resid + i * d;
#pragma omp simd
          for (i64 j = 0; j < d; ++j) {
            float v = r * (g[j] * w[j] - a - (xr[j] - mu) * r * c) + rr[j];
            fr[j] += rr[j];
            o[j] = v;
            fx[j] += v;
          }
        } else {
#pragma omp simd
          for (i64 j = 0; j < d; ++j) {
            float v = r * (g[j] * w[j] - a - (xr[j] - mu) * r * c);
            o[j] = v;
            fx[j] += v;
          }
        }
      }
      for (i64 j = 0; j < 4 * d; ++j) acc[j] += fs[j];
    }
  }
  for (i64 j = 0; j < d; ++j) {
    if (dw) dw[j] = partials_sum(&P, 4 * d, j);
    if (db) db[j] = partials_sum(&P, 4 * d, d + j);
    if (rsum) rsum[j] = partials_sum(&P, 4 * d, 2 * d + j);
    if (dxsum) dxsum[j] = partials_sum(&P, 4 * d, 3 * d + j);
  }
  partials_free(&P);
  return 0;
}
