package model

import "math"

// ropeAngles fills cos and sin (RopeDims/2 entries each) for position pos.
func (c *Config) ropeAngles(pos int, cos, sin []float32) {
	n := c.RopeDims / 2
	if c.RopeRunC {
		// llama2.c: freq = 1/powf(10000, d/headSize) for each even d.
		for i := 0; i < n; i++ {
			freq := 1 / float32(math.Pow(float64(c.RopeBase), float64(float32(2*i)/float32(c.HeadDim))))
			val := float32(pos) * freq
			cos[i] = float32(math.Cos(float64(val)))
			sin[i] = float32(math.Sin(float64(val)))
		}
		return
	}
	// ggml: a running product theta *= base^(-2/dims), in float32, so that
	// angles at long positions round exactly as llama.cpp's do.
	thetaScale := float32(math.Pow(float64(c.RopeBase), -2.0/float64(c.RopeDims)))
	theta := float32(pos)
	for i := 0; i < n; i++ {
		t := theta
		if c.RopeFreqFactors != nil {
			t /= c.RopeFreqFactors[i]
		}
		t *= c.RopeFreqScale
		cos[i] = float32(math.Cos(float64(t)))
		sin[i] = float32(math.Sin(float64(t)))
		if c.RopeAttnFactor != 0 {
			// ggml's mscale: cosf(theta)*mscale, rounded as it is.
			cos[i] *= c.RopeAttnFactor
			sin[i] *= c.RopeAttnFactor
		}
		theta *= thetaScale
	}
}

// applyRope rotates every head of x (heads × HeadDim values) in place.
func (c *Config) applyRope(x []float32, heads int, cos, sin []float32) {
	hd, n := c.HeadDim, c.RopeDims/2
	for h := 0; h < heads; h++ {
		v := x[h*hd : (h+1)*hd]
		if c.RopeStyle == RopeNeox {
			for i := 0; i < n; i++ {
				x0, x1 := v[i], v[i+n]
				v[i] = x0*cos[i] - x1*sin[i]
				v[i+n] = x0*sin[i] + x1*cos[i]
			}
			continue
		}
		for i := 0; i < n; i++ {
			x0, x1 := v[2*i], v[2*i+1]
			v[2*i] = x0*cos[i] - x1*sin[i]
			v[2*i+1] = x0*sin[i] + x1*cos[i]
		}
	}
}
