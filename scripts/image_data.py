#!/usr/bin/env python3
"""A synthetic image-classification set for samples/vit.fsm, as .npy files.

Each image is one of up to six patterns, its class: 0 horizontal stripes, 1 vertical
stripes, 2 diagonal stripes, 3 anti-diagonal stripes, 4 a checkerboard, 5 concentric
rings. Every image draws its own stripe period (3 to 6 pixels), phase, two colours and
Gaussian pixel noise, so no single pixel or colour tells the class: the orientation
does, and a ViT's patches see it. Labels are balanced (class i of image n is n mod K,
then shuffled), and the same --seed gives the same bytes.

Writes OUT/train/images.npy (f32 [N, S, S, 3], channels last; colours in [0, 1]
normalized to (x - 0.5) / 0.25, about [-2, 2], without which a small ViT does not learn) and
OUT/train/labels.npy (i32 [N]), and the same under OUT/val/ for --val images: the
names are samples/vit.fsm's inputs, so `fsexec PLAN --data OUT/train --val-data OUT/val`
reads them. Pure Python and numpy.
"""
import argparse
import os
import sys

import numpy as np

PATTERNS = ("horizontal", "vertical", "diagonal", "anti-diagonal", "checkerboard", "rings")


def make(n, size, classes, noise, rng):
    """n images [n, size, size, 3] f32 and their labels [n] i32."""
    labels = rng.permutation(np.arange(n) % classes).astype(np.int32)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    images = np.empty((n, size, size, 3), np.float32)
    for i, k in enumerate(labels):
        period = rng.uniform(3.0, 6.0)
        phase = rng.uniform(0.0, 2 * np.pi)
        if k == 0:
            u = yy
        elif k == 1:
            u = xx
        elif k == 2:
            u = (xx + yy) / np.sqrt(2)
        elif k == 3:
            u = (xx - yy) / np.sqrt(2)
        elif k == 4:
            u = None
        else:
            cy, cx = rng.uniform(0.3 * size, 0.7 * size, size=2)
            u = np.hypot(yy - cy, xx - cx)
        if u is None:
            w = 0.5 + 0.5 * np.sign(np.sin(2 * np.pi * yy / period + phase) * np.sin(2 * np.pi * xx / period + phase))
        else:
            w = 0.5 + 0.5 * np.sin(2 * np.pi * u / period + phase)
        a = rng.uniform(0.0, 1.0, size=3)  # two colours at least 0.3 apart in each channel
        b = (a + rng.uniform(0.3, 0.7, size=3)) % 1.0
        img = w[..., None] * a + (1 - w[..., None]) * b + rng.normal(0.0, noise, size=(size, size, 3))
        images[i] = (img - 0.5) / 0.25  # normalized, as torchvision's Normalize(0.5, 0.25): a ViT needs it to learn
    return images, labels


def write(out, images, labels):
    os.makedirs(out, exist_ok=True)
    np.save(os.path.join(out, "images.npy"), images)
    np.save(os.path.join(out, "labels.npy"), labels)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Make a synthetic image-classification set (stripes, checkerboards, rings with random "
                    "period, phase, colours and noise) as .npy files for samples/vit.fsm.",
        epilog="Classes: " + ", ".join("%d %s" % kv for kv in enumerate(PATTERNS)) + ". Example: "
               "scripts/image_data.py --out data/vit, then fsexec vit.plan --data data/vit/train "
               "--val-data data/vit/val.")
    ap.add_argument("--out", required=True, help="directory to write train/ and val/ into (created)")
    ap.add_argument("--train", type=int, default=4096, help="training images (default 4096)")
    ap.add_argument("--val", type=int, default=512, help="held-out images (default 512; 0: no val/)")
    ap.add_argument("--size", type=int, default=32, help="image side in pixels, S x S x 3 (default 32)")
    ap.add_argument("--classes", type=int, default=4, help="number of classes K, 2 to %d (default 4): the "
                    "first K patterns" % len(PATTERNS))
    ap.add_argument("--noise", type=float, default=0.1, help="std of the Gaussian pixel noise (default 0.1)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = ap.parse_args(argv)
    if not 2 <= args.classes <= len(PATTERNS):
        ap.error("--classes %d: must be 2 to %d (the patterns: %s)" % (args.classes, len(PATTERNS),
                                                                      ", ".join(PATTERNS)))
    if args.train < 1:
        ap.error("--train %d: must be at least 1 image" % args.train)
    if args.val < 0:
        ap.error("--val %d: must be 0 or more images" % args.val)
    if args.size < 4:
        ap.error("--size %d: must be at least 4 pixels (stripes need room)" % args.size)
    if not args.noise >= 0 or not np.isfinite(args.noise):
        ap.error("--noise %r: must be a finite number >= 0" % args.noise)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        ap.error("--out %s: exists and is not a directory" % args.out)
    rng = np.random.default_rng(args.seed)
    try:
        write(os.path.join(args.out, "train"), *make(args.train, args.size, args.classes, args.noise, rng))
        if args.val:
            write(os.path.join(args.out, "val"), *make(args.val, args.size, args.classes, args.noise, rng))
    except OSError as e:
        sys.exit("image_data.py: cannot write under %s: %s" % (args.out, e))
    print("wrote %d training%s images of %dx%dx3, %d classes (%s), under %s" % (
        args.train, " and %d held-out" % args.val if args.val else "", args.size, args.size, args.classes,
        ", ".join(PATTERNS[:args.classes]), args.out))


if __name__ == "__main__":
    main()
