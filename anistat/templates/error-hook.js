window.addEventListener('error',function(e){document.documentElement.setAttribute('data-js-error',String(e.message||'error'));});
