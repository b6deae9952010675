"""Issue 6 tool (CPU): registers touched under a running wgmma in a kernel's SASS (`triton_fa2.gluon.wgmma_hazards`).

    SASS_OUT=k.sass python tools/gluon_attention.py --compile --config 64,64,2,4; python tools/wgmma_hazards.py k.sass
"""
import sys
from triton_fa2.gluon import wgmma_hazards

for path in sys.argv[1:]:
    found = wgmma_hazards(open(path).read())
    print(f"{path}: {len(found)} hazards")
    for loop, address, instruction in found[:6]: print(f"    loop {loop}: {address} {instruction}")
