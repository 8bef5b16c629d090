#!/usr/bin/env python3
"""Make PyTorch's torch/utils/viz/MemoryViz.js run offline: replace its five cdn.skypack.dev
imports (d3@5, d3-axis@1, d3-scale@1, d3-zoom@1, d3-brush@1) by the global `d3` of d3 v5's UMD
bundle (node_modules/d3/dist/d3.min.js, loaded by page.html as a classic script; it bundles
axisLeft, scaleLinear, zoom, zoomIdentity and brushX, and exposes the live `d3.event`).
Nothing else changes. Usage: patch_imports.py MemoryViz.orig.js MemoryViz.js"""
import sys

src = open(sys.argv[1]).read()
old = '''import * as d3 from "https://cdn.skypack.dev/d3@5";
import {axisLeft} from "https://cdn.skypack.dev/d3-axis@1";
import {scaleLinear} from "https://cdn.skypack.dev/d3-scale@1";
import {zoom, zoomIdentity} from "https://cdn.skypack.dev/d3-zoom@1";
import {brushX} from "https://cdn.skypack.dev/d3-brush@1";
'''
new = '''// [memviz harness] offline: d3 v5 is loaded as a classic <script> (global d3) before this module
const d3 = window.d3;
const {axisLeft, scaleLinear, zoom, zoomIdentity, brushX} = d3;
'''
if src.count(old) != 1:
    sys.exit("the five skypack imports were not found exactly once: has MemoryViz.js changed?")
open(sys.argv[2], "w").write(src.replace(old, new))
